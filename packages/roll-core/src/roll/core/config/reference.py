"""Every key of a config model, flattened: the configuration reference and ``roll validate --explain``.

Two readers share one walk over the pydantic models:

- :func:`reference_pages` renders the Markdown pages of ``docs/reference/`` from every installed plugin's config
  model (pipelines, strategies, rewards, environments, tools) and the trackers' and tool-call formats' names. The pages are generated,
  never edited by hand: ``scripts/gen_config_reference.py`` writes them and a test regenerates them in memory and
  compares, so the reference cannot go stale.
- :func:`defaults_left` lists, for a loaded config, the keys it leaves at their defaults and their values: what
  ``roll validate --explain`` prints beside the pipeline's preset explanation.

The walk recurses into nested models, ``X | None`` of one model, ``list[Model]`` (as ``key[]``) and
``dict[str, Model]`` (as ``key.<name>``); a union of several models (a ``type``-discriminated strategy) is one
row naming its variants, which have sections of their own. It reads annotations only; nothing is validated.
"""

from __future__ import annotations

import enum
import json
import re
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from roll.core.config.schema import alternatives, type_name

REQUIRED = "required"
"""What the default column says for a key without a default."""
DERIVED = "(derived)"
"""What it says for a default computed from the other keys (the description says how)."""


@dataclass(frozen=True)
class KeyDoc:
    """One key of a config model: its dotted path, type, default and description."""

    path: str
    type: str
    default: str
    description: str


# ------------------------------------------------------------------------------------------------ the walk


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _nested(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """``("", M)`` for ``M`` or ``M | None``, ``("[]", M)`` for ``list[M]``, ``(".<name>", M)`` for
    ``dict[str, M]``; None for anything else (several models in a union included: they get a row of their own)."""
    alts = [a for a in alternatives(annotation) if a is not type(None)]
    if len(alts) != 1:
        return None
    alt = alts[0]
    if _is_model(alt):
        return "", alt
    origin, args = typing.get_origin(alt), typing.get_args(alt)
    if origin in (list, tuple, typing.Sequence) and len(args) >= 1 and _is_model(args[0]):
        return "[]", args[0]
    if origin in (dict, typing.Mapping) and len(args) == 2 and _is_model(args[1]):
        return ".<name>", args[1]
    return None


def iter_keys(model: type[BaseModel], prefix: str = "") -> Iterator[KeyDoc]:
    """Every key of ``model`` in declaration order, depth first; a nested section yields its own row first."""
    for name, field in model.model_fields.items():
        key = field.alias or name
        path = f"{prefix}{key}"
        nested = _nested(field.annotation)
        # A section without a description of its own is described by its model's docstring.
        about = _description(field) or (_doc_line(nested[1]) if nested is not None else "")
        yield KeyDoc(path, _type_text(field), _default_text(field, nested is not None), about)
        if nested is not None:
            suffix, child = nested
            yield from iter_keys(child, f"{path}{suffix}.")
        elif name not in UNEXPANDED:
            for tag, variant in _variants(field.annotation):
                for doc in iter_keys(variant, f"{path}."):
                    yield KeyDoc(doc.path, doc.type, doc.default, f"(type {tag}) {doc.description}".rstrip())


UNEXPANDED = frozenset({"strategy"})
"""Unions not expanded in place: a role's strategy has a page of its own (every role would repeat it)."""


def _variants(annotation: Any) -> list[tuple[str, type[BaseModel]]]:
    """``(type tag, model)`` of a ``type``-discriminated union of models (empty for anything else)."""
    alts = [a for a in alternatives(annotation) if a is not type(None)]
    if len(alts) < 2 or not all(_is_model(a) for a in alts):
        return []
    tagged = []
    for alt in alts:
        field = alt.model_fields.get("type")
        tags = typing.get_args(field.annotation) if field is not None else ()
        if len(tags) != 1:
            return []
        tagged.append((str(tags[0]), alt))
    return tagged


def _type_text(field: FieldInfo) -> str:
    text = type_name(field.annotation)
    bounds = [_bound(m) for m in field.metadata]
    bounds = [b for b in bounds if b]
    return f"{text} ({', '.join(bounds)})" if bounds else text


_BOUNDS = {
    "gt": ">",
    "ge": ">=",
    "lt": "<",
    "le": "<=",
    "min_length": "min length",
    "max_length": "max length",
}


def _bound(meta: Any) -> str:
    for attr, word in _BOUNDS.items():
        value = getattr(meta, attr, None)
        if value is not None:
            return f"{word} {value}"
    return ""


def _default_text(field: FieldInfo, is_section: bool) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return REQUIRED
    if field.default_factory_takes_validated_data:
        return DERIVED
    if is_section:
        value = _default_value(field)
        return "null" if value is None else "(section)"
    value = _default_value(field)
    if isinstance(value, BaseModel):
        tag = getattr(value, "type", None)
        return f"type {tag!r}, its defaults" if isinstance(tag, str) else "(its defaults)"
    return render_value(value)


def _default_value(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return field.default


def render_value(value: Any) -> str:
    """A default as YAML-ish text: ``null``, ``true``, ``0.2``, ``"outputs/run"``, ``["stdout", "jsonl"]``."""
    return json.dumps(_plain(value), ensure_ascii=False)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return value


def _description(field: FieldInfo) -> str:
    return " ".join((field.description or "").split())


# ------------------------------------------------------------------------------------------------ --explain


def defaults_left(config: BaseModel, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(key path, value)`` of every leaf key the loaded ``config`` leaves at its default.

    A key counts as set when the YAML, an override or a preset gave it (pydantic's ``model_fields_set``); a
    section that was not given at all is listed key by key.
    """
    for name, field in type(config).model_fields.items():
        key = f"{prefix}{field.alias or name}"
        value = getattr(config, name)
        if isinstance(value, BaseModel):
            yield from _section_defaults(value, key, name in config.model_fields_set)
        elif name not in config.model_fields_set:
            yield key, render_value(value)


def _section_defaults(section: BaseModel, key: str, was_set: bool) -> Iterator[tuple[str, str]]:
    if was_set:
        yield from defaults_left(section, f"{key}.")
        return
    yield from _leaves(section, f"{key}.")


def _leaves(section: BaseModel, prefix: str) -> Iterator[tuple[str, str]]:
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        key = f"{prefix}{field.alias or name}"
        if isinstance(value, BaseModel):
            yield from _leaves(value, f"{key}.")
        else:
            yield key, render_value(value)


# ------------------------------------------------------------------------------------------------ the pages


def _cell(text: str) -> str:
    """Table-cell text: pipes would end the cell, so unions read ``a or b``."""
    return text.replace(" | ", " or ").replace("|", "\\|").replace("\n", " ")


def key_table(model: type[BaseModel], skip: frozenset[str] = frozenset()) -> str:
    """A Markdown table of every key of ``model`` except the top-level ones in ``skip`` (and their children)."""
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for doc in iter_keys(model):
        if doc.path.split(".", 1)[0].split("[", 1)[0] in skip:
            continue
        rows.append(
            f"| `{doc.path}` | {_cell(doc.type)} | `{_cell(doc.default)}` | {_cell(doc.description)} |"
        )
    return "\n".join(rows)


_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_VARIANT_TAG = re.compile(r"^\(type [^)]*\)")


def undescribed_keys(page: str) -> list[str]:
    """The keys in the key tables of a rendered ``page`` whose description cell is empty; a variant's
    ``(type x)`` tag alone counts as empty. The reference test requires none, so every new key must say what it
    does (a ``Field(description=...)``, or for a section its model's docstring)."""
    missing = []
    for line in page.splitlines():
        cells = [cell.strip() for cell in _CELL_SPLIT.split(line)]
        if len(cells) == 6 and cells[1].startswith("`") and not _VARIANT_TAG.sub("", cells[4]).strip():
            missing.append(cells[1].strip("`"))
    return missing


def _doc_line(obj: Any) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    first = doc.split("\n\n", 1)[0].replace("``", "`")
    return " ".join(first.split())


GENERATED = (
    "<!-- Generated by scripts/gen_config_reference.py from the installed plugins' config models; do not edit. "
    "tests/test_docs.py fails when it is stale. -->"
)


def _page(title: str, intro: str, sections: list[str]) -> str:
    return "\n\n".join([GENERATED, f"# {title}", intro, *sections]) + "\n"


def _pipelines_page(specs: Mapping[str, Any], common: type[BaseModel]) -> str:
    skip = frozenset(common.model_fields)
    seen: dict[type[BaseModel], str] = {}
    sections = []
    for name, spec in specs.items():
        model = spec.config_model
        head = (
            f"## `{name}`\n\n{spec.description or _doc_line(model)}\n\nConfig model: `{model.__qualname__}`."
        )
        if model in seen:
            sections.append(f"{head} The same keys as [`{seen[model]}`](#{seen[model]}).")
            continue
        seen[model] = name
        sections.append(f"{head}\n\n{key_table(model, skip)}")
    intro = (
        "The keys of each training mode (`pipeline:`), beyond those every run has (see [run](run.md)). "
        "`a[].b` is key `b` of each item of list `a`; `a.<name>.b` is key `b` of each entry of mapping `a`. "
        "A role's `strategy` is one of the [strategies](strategies.md), chosen by its `type`."
    )
    return _page("Pipelines", intro, sections)


def _models_page(title: str, group: str, specs: Mapping[str, Any], intro: str) -> str:
    sections = []
    for name, spec in specs.items():
        model = getattr(spec, "config_model", None)
        head = f"## `{name}`\n\n{spec.description or ''}".rstrip()
        extra = getattr(spec, "extra", None)
        kind = getattr(spec, "kind", None)
        facts = [f"Kind: {kind}." if kind else "", f"Extra: `{extra}`." if extra else ""]
        facts_text = " ".join(f for f in facts if f)
        if model is None:
            sections.append(f"{head}\n\n{facts_text}\n\nNo options.".replace("\n\n\n\n", "\n\n"))
            continue
        doc = _doc_line(model)
        body = "\n\n".join(t for t in (facts_text, doc, f"Config model: `{model.__qualname__}`.") if t)
        sections.append(f"{head}\n\n{body}\n\n{key_table(model)}")
    return _page(title, intro.format(group=group), sections)


def _trackers_page(specs: Mapping[str, Any]) -> str:
    rows = ["| name | what it writes |", "|---|---|"]
    rows += [f"| `{name}` | {_cell(spec.description)} |" for name, spec in specs.items()]
    intro = (
        "Trackers are named in `tracking.backends` (entry-point group `roll.tracker`); they take no options of "
        "their own: `tracking.*` (see [run](run.md)) applies to all of them."
    )
    return _page("Trackers", intro, ["\n".join(rows)])


def _tool_formats_section(specs: Mapping[str, Any]) -> str:
    rows = ["| name | calls look like |", "|---|---|"]
    rows += [f"| `{name}` | {_cell(spec.description)} |" for name, spec in specs.items()]
    intro = (
        "## Tool-call formats\n\nEntry-point group `roll.tool_parser`. An env entry's `tool_calls.format` (countdown: "
        "`options.tools.format`) names one: it writes the tools section of the system prompt and reads the calls in "
        "the model's turns. No options."
    )
    return intro + "\n\n" + "\n".join(rows)


def reference_pages() -> dict[str, str]:
    """``{file name: Markdown}`` for every page of the configuration reference, from the installed plugins."""
    from roll.core import plugins
    from roll.core.config.sections import RunConfig

    def group(name: str) -> dict[str, Any]:
        return plugins.load_all(name)

    run_intro = (
        "The keys every run has, whatever its `pipeline` (config model `RunConfig`); each pipeline adds its "
        "own ([pipelines](pipelines.md))."
    )
    plugin_intro = (
        "Entry-point group `{group}`. Each section is one plugin: its name, what it does and its options."
    )
    rewards = {**group("roll.reward"), **group("roll.diffusion_reward")}
    return {
        "run.md": _page("Every run", run_intro, [key_table(RunConfig)]),
        "pipelines.md": _pipelines_page(group("roll.pipeline"), RunConfig),
        "strategies.md": _models_page("Strategies", "roll.strategy", group("roll.strategy"), plugin_intro),
        "rewards.md": _models_page(
            "Rewards", "roll.reward` and `roll.diffusion_reward", rewards, plugin_intro
        ),
        "envs.md": _models_page("Environments", "roll.env", group("roll.env"), plugin_intro),
        "tools.md": _models_page("Tools", "roll.tool", group("roll.tool"), plugin_intro).rstrip("\n")
        + "\n\n"
        + _tool_formats_section(group("roll.tool_parser"))
        + "\n",
        "trackers.md": _trackers_page(group("roll.tracker")),
    }
