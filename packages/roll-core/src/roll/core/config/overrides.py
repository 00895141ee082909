"""Dotted command-line overrides, Hydra's grammar for the parts roll needs.

- ``a.b.c=value`` sets an existing key. The value is read as a YAML scalar or flow value: ``8`` is an int,
  ``3e-4`` a float, ``true`` a bool, ``[1,2]`` a list, ``{x: 1}`` a mapping, ``null`` is None, and an empty
  value is the empty string. Digits index lists: ``stages.0.lr=1e-5``.
- ``+a.b=value`` adds a key that does not exist yet (missing parents are created); adding one that exists is
  an error, so a typo cannot hide behind a ``+``. ``++a.b=value`` sets whether or not it exists.
- ``~a.b`` deletes a key.

Setting a key that does not exist without ``+`` is an error with a did-you-mean, unless the config model
declares the key (``field_names``, see :func:`roll.core.config.schema.field_names`): a key left at its pydantic
default is not in the YAML, and ``seed=1`` must still work. Setting a key of an older layout (``moved``, see
:meth:`roll.core.config.sections.RunConfig.moved_keys`) names its new path. Each value remembers its origin as
``<override 2: a.b=3>`` (1-based position on the command line). All problems are reported at once.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from roll.core.config.yaml_tree import Sources, drop_sources, parse_value
from roll.core.errors import ConfigError, ConfigIssue

FieldNames = Callable[[Sequence[str]], Collection[str]]
"""The keys a config model declares under a path (empty when it declares none or does not know)."""

Op = Literal["set", "add", "force", "delete"]
_PREFIXES: tuple[tuple[str, Op], ...] = (("++", "force"), ("+", "add"), ("~", "delete"))


@dataclass(frozen=True)
class Override:
    """One parsed override: what to do, where, with which value, and how to name it in errors."""

    op: Op
    keys: tuple[str, ...]
    value: Any
    text: str
    position: int

    @property
    def path(self) -> str:
        return ".".join(self.keys)

    @property
    def source(self) -> str:
        return f"<override {self.position}: {self.text}>"


def parse_override(text: str, position: int) -> Override:
    """Parse one override; ``position`` is its 1-based place on the command line. Raises :class:`ConfigError`."""
    source = f"<override {position}: {text}>"
    op: Op = "set"
    body = text.strip()
    for prefix, prefix_op in _PREFIXES:
        if body.startswith(prefix):
            op, body = prefix_op, body[len(prefix) :]
            break
    key, eq, raw = body.partition("=")
    keys = tuple(key.strip().split("."))
    if not key.strip() or not all(keys):
        raise _error(
            key,
            f"malformed key {key.strip()!r}",
            "write dotted keys like actor_train.strategy.optimizer.lr=1e-5",
            source,
        )
    if op == "delete":
        if eq:
            raise _error(key, "a deletion takes no value", f"write ~{key.strip()}", source)
        return Override(op, keys, None, text, position)
    if not eq:
        raise _error(
            key, "expected key=value", f"for example {key.strip()}=1, or ~{key.strip()} to delete", source
        )
    try:
        value = parse_value(raw.strip())
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise _error(key, f"value {raw!r} is not valid YAML: {problem}", "quote it", source) from None
    return Override(op, keys, value, text, position)


def _error(path: str, message: str, hint: str | None, source: str) -> ConfigError:
    return ConfigError(issues=[ConfigIssue(path.strip(), message, hint, source)])


def apply_overrides(
    data: dict[str, Any],
    sources: Sources,
    overrides: Sequence[str],
    field_names: FieldNames | None = None,
    moved: Mapping[str, str] | None = None,
) -> None:
    """Apply ``overrides`` to ``data`` in order, in place, recording their sources; ``moved`` maps keys of an
    older layout (dotted paths) to their new path.

    Every override is attempted, so one run reports every bad override. Raises :class:`ConfigError`.
    """
    issues: list[ConfigIssue] = []
    for position, text in enumerate(overrides, start=1):
        try:
            override = parse_override(text, position)
            _refuse_moved(data, override, moved or {})
            _apply(data, sources, override, field_names or _no_fields)
        except ConfigError as exc:
            issues.extend(exc.issues)
    if issues:
        raise ConfigError(issues=issues)


def _refuse_moved(data: dict[str, Any], override: Override, moved: Mapping[str, str]) -> None:
    """Setting a moved key that the YAML does not hold: name its new path (not 'no key ... write +...')."""
    if override.op != "set":
        return
    node: Any = data
    for depth, key in enumerate(override.keys):
        at = ".".join(override.keys[: depth + 1])
        present = _exists(node, key)
        if not present and at in moved:
            message = f"no key {at!r} to override: it has moved"
            raise _error(at, message, f"move it to {moved[at]}", override.source)
        node = (node[int(key)] if isinstance(node, list) else node[key]) if present else None


def _no_fields(keys: Sequence[str]) -> Collection[str]:
    return ()


def _apply(data: dict[str, Any], sources: Sources, override: Override, field_names: FieldNames) -> None:
    *parent_keys, last = override.keys
    declared = last in field_names(parent_keys)
    create = override.op in ("add", "force") or (override.op == "set" and declared)
    parent = _parent(data, override, create, field_names)
    exists = _exists(parent, last)
    if override.op == "delete":
        if not exists:
            raise _missing(parent, last, override, field_names)
        _delete(parent, last)
        drop_sources(sources, override.path)
        return
    if override.op == "add" and exists:
        raise _error(
            override.path, "key already exists; `+` only adds new keys", _drop_plus(override), override.source
        )
    if override.op == "set" and not exists and not declared:
        raise _missing(parent, last, override, field_names)
    _store(parent, last, override)
    drop_sources(sources, override.path)
    sources[override.path] = override.source


def _drop_plus(override: Override) -> str:
    return f"write {override.text.strip().lstrip('+')} to change it"


def _parent(data: dict[str, Any], override: Override, create: bool, field_names: FieldNames) -> Any:
    """The container that holds the override's last key; creates missing mappings when ``create``, and a section
    the config model declares but the YAML leaves out (so a misspelt key in it is named, not the section)."""
    node: Any = data
    for depth, key in enumerate(override.keys[:-1]):
        if not _exists(node, key):
            declared = override.op == "set" and key in field_names(override.keys[:depth])
            if not ((create or declared) and isinstance(node, dict)):
                raise _missing(node, key, override, field_names, depth)
            node[key] = {}
        node = node[int(key)] if isinstance(node, list) else node[key]
        if not isinstance(node, dict | list):
            where = ".".join(override.keys[: depth + 1])
            message = f"{where} is a {type(node).__name__}, not a mapping, so it has no key {override.keys[depth + 1]!r}"
            raise _error(override.path, message, None, override.source)
    return node


def _exists(node: Any, key: str) -> bool:
    if isinstance(node, list):
        return key.isdigit() and int(key) < len(node)
    return isinstance(node, dict) and key in node


def _store(parent: Any, key: str, override: Override) -> None:
    if isinstance(parent, list):
        if not _exists(parent, key):
            raise _error(
                override.path,
                "lists cannot grow by index",
                "set the whole list: key=[a,b,c]",
                override.source,
            )
        parent[int(key)] = override.value
    else:
        parent[key] = override.value


def _delete(parent: Any, key: str) -> None:
    if isinstance(parent, list):
        del parent[int(key)]
    else:
        del parent[key]


def _missing(
    node: Any, key: str, override: Override, field_names: FieldNames, depth: int | None = None
) -> ConfigError:
    """'no key' error for ``override.keys[depth]``, suggesting close keys at that level."""
    depth = len(override.keys) - 1 if depth is None else depth
    at = ".".join(override.keys[: depth + 1])
    verb = "delete" if override.op == "delete" else "override"
    if isinstance(node, list):
        size = f"{'.'.join(override.keys[:depth])} is a list of {len(node)} items (indices from 0)"
        return _error(at, f"no item {at!r} to {verb}", size, override.source)
    close = _did_you_mean(node, key, override.keys[:depth], field_names)
    add = f"to add a new key write +{override.path}=..." if override.op != "delete" else None
    hint = f"{close} ({add})" if close and add else close or add
    return _error(at, f"no key {at!r} to {verb}", hint, override.source)


def _did_you_mean(node: Any, key: str, parent: Sequence[str], field_names: FieldNames) -> str | None:
    known = set(map(str, node)) if isinstance(node, dict) else set()
    known |= set(field_names(parent))
    close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
    suggestions = [".".join((*parent, name)) for name in close]
    return f"did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else None
