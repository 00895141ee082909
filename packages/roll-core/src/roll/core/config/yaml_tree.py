"""Reading YAML into plain trees that remember where every key came from.

A config tree is plain data (``dict``/``list``/scalars) plus a flat ``sources`` map from dotted key path to a
human location (``conf/model/tiny.yaml:12``, ``<override 2: a.b=3>``). Paths join mapping keys and list indices
with dots (``roles.0.name``); the root is ``""``. Keeping locations beside the data, rather than wrapping every
value, lets the rest of the loader and pydantic work on ordinary dicts.

:class:`RollYamlLoader` is a ``SafeLoader`` subclass (so the global ``SafeLoader`` stays untouched) that

- rejects duplicate keys in one mapping, which plain YAML silently resolves to the last one;
- reads ``1e-6`` as a float: YAML 1.1 wants ``1.0e-6``, and learning rates are written the short way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from roll.core.errors import ConfigError, ConfigIssue

Sources = dict[str, str]
"""Dotted key path -> where its value was written (``file.yaml:12`` or ``<override 1: a=2>``)."""

_MERGE_TAG = "tag:yaml.org,2002:merge"


class RollYamlLoader(yaml.SafeLoader):
    """``SafeLoader`` with duplicate-key errors and exponent-only floats (see the module docstring)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        _reject_duplicate_keys(node)
        result: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return result


RollYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _reject_duplicate_keys(node: MappingNode) -> None:
    seen: dict[str, Node] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
            continue
        first = seen.setdefault(key_node.value, key_node)
        if first is not key_node:
            raise ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"duplicate key {key_node.value!r} (first written on line {first.start_mark.line + 1})",
                key_node.start_mark,
            )


def join(path: str, key: object) -> str:
    """The dotted path of ``key`` under ``path``."""
    return f"{path}.{key}" if path else str(key)


def display_path(path: Path) -> str:
    """``path`` relative to the working directory when it is below it (shorter errors), else absolute."""
    try:
        return os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)
    except ValueError:
        return str(path)


def nearest_source(sources: Mapping[str, str], path: str) -> str | None:
    """The location of ``path`` or, failing that, of its closest ancestor (a missing key points at its parent)."""
    while True:
        if path in sources:
            return sources[path]
        if not path:
            return None
        path = path.rpartition(".")[0]


def read_yaml(path: Path) -> tuple[dict[str, Any], Sources]:
    """Read one YAML file whose top level is a mapping (an empty file reads as ``{}``).

    Raises :class:`ConfigError` for a missing file, a syntax error (``file:line:col``), a duplicate key or a
    top level that is not a mapping.
    """
    shown = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _file_error(shown, f"cannot read config file: {exc.strerror or exc}") from None
    loader = RollYamlLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(shown, exc) from None
    except yaml.YAMLError as exc:
        raise _file_error(shown, f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    if data is None:
        return {}, {"": shown}
    if not isinstance(data, dict) or node is None:
        kind = type(data).__name__
        raise _file_error(shown, f"the top level must be a mapping of keys to values, not a {kind}")
    sources: Sources = {"": shown}
    _record_marks(RollYamlLoader(""), node, data, "", shown, sources, set())
    return data, sources


def _file_error(shown: str, message: str) -> ConfigError:
    return ConfigError(issues=[ConfigIssue(path="", message=message, source=shown)])


def _syntax_error(shown: str, exc: yaml.MarkedYAMLError) -> ConfigError:
    """``file:line:col`` of the problem, plus where the construct it broke began (often the real mistake)."""
    mark = exc.problem_mark or exc.context_mark
    where = f"{shown}:{mark.line + 1}:{mark.column + 1}" if mark else shown
    message = f"YAML syntax error: {exc.problem or exc.context}"
    if exc.problem and exc.context and exc.context_mark is not None:
        message += f" ({exc.context} started at line {exc.context_mark.line + 1})"
    return ConfigError(issues=[ConfigIssue(path="", message=message, source=where)])


def _record_marks(
    loader: RollYamlLoader, node: Node, data: Any, path: str, shown: str, out: Sources, active: set[int]
) -> None:
    """Walk the composed node graph beside the constructed data and store each key's line.

    ``construct_mapping`` already flattened ``<<`` merge keys into ``node.value``, so the pairs walk in the same
    order the data was built and the last duplicate wins in both. ``active`` guards recursive aliases.
    """
    if id(node) in active:
        return
    active.add(id(node))
    for key, line, child_node, child_data in _children(loader, node, data):
        child = join(path, key)
        out[child] = f"{shown}:{line}"
        _record_marks(loader, child_node, child_data, child, shown, out, active)
    active.discard(id(node))


def _children(loader: RollYamlLoader, node: Node, data: Any) -> Iterator[tuple[object, int, Node, Any]]:
    """(key, 1-based line, node, data) of each child. A mapping entry reports its key's line, which is where a
    reader looks for ``lr:``, even when the value starts on the next line."""
    if isinstance(node, MappingNode) and isinstance(data, dict):
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) and key in data:
                yield key, key_node.start_mark.line + 1, value_node, data[key]
    elif isinstance(node, SequenceNode) and isinstance(data, list):
        for index, (item_node, item) in enumerate(zip(node.value, data)):
            yield index, item_node.start_mark.line + 1, item_node, item


def parse_value(text: str) -> Any:
    """Parse an override's value as a YAML scalar or flow value: ``8`` -> 8, ``[1,2]`` -> list, ``null`` -> None.

    An empty value is the empty string (as in Hydra), not ``None``: ``a=`` clears a string, ``a=null`` unsets.
    """
    if text == "":
        return ""
    return yaml.load(text, Loader=RollYamlLoader)  # a SafeLoader subclass: safe


def deep_merge(
    dst: dict[str, Any], dst_sources: Sources, src: Mapping[str, Any], src_sources: Mapping[str, str]
) -> None:
    """Merge ``src`` into ``dst`` in place: mappings merge key by key, anything else (lists too) is replaced.

    Both trees are rooted at the same path, and sources follow the data: a replaced value drops the locations
    of everything that was under it.
    """
    _merge_at(dst, dst_sources, src, src_sources, "")


def _merge_at(
    dst: dict[str, Any],
    dst_sources: Sources,
    src: Mapping[str, Any],
    src_sources: Mapping[str, str],
    path: str,
) -> None:
    for key, value in src.items():
        child = join(path, key)
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            if child in src_sources:
                dst_sources[child] = src_sources[child]
            _merge_at(dst[key], dst_sources, value, src_sources, child)
            continue
        dst[key] = value
        drop_sources(dst_sources, child)
        dst_sources.update(sources_under(src_sources, child))


def sources_under(sources: Mapping[str, str], path: str) -> Sources:
    """The entries of ``sources`` for ``path`` itself and everything below it."""
    prefix = path + "."
    return {key: where for key, where in sources.items() if key == path or key.startswith(prefix)}


def drop_sources(sources: Sources, path: str) -> None:
    """Forget the locations of ``path`` and everything below it."""
    for key in list(sources_under(sources, path)):
        del sources[key]


def rebase_sources(sources: Mapping[str, str], old: str, new: str) -> Sources:
    """Move the locations of the subtree at ``old`` (``""`` for a whole file) to ``new``."""
    moved: Sources = {}
    for key, where in (sources_under(sources, old) if old else sources).items():
        rest = key[len(old) + 1 :] if old else key
        moved[join(new, rest) if rest else new] = where
    return moved
