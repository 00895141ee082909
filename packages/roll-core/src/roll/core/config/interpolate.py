"""``${...}`` interpolation, resolved once on the composed and overridden tree.

- ``${a.b.c}``: the value at an absolute dotted key path (list items by index: ``${roles.0.name}``). A string
  that is exactly one reference takes the referenced value with its type (an int stays an int, a mapping is
  copied); a reference inside a longer string is formatted into it (``"${output_dir}/ckpt"``), and only
  scalars may be.
- ``${env:VAR}`` and ``${env:VAR,default}`` (``oc.env`` is accepted too, for OmegaConf-style files): an
  environment variable, as a string; pydantic converts it to the field's type later. The default is the text
  after the first comma, stripped.
- ``\\${...}`` is a literal ``${...}``.

Every problem becomes a :class:`ConfigIssue` at the path of the key that holds the reference: an unknown key
(with did-you-mean), an unset variable without default, a cycle (``a -> b -> a``). All are reported at once.
Resolution happens after overrides, so ``output_dir=/tmp/x`` also moves ``"${output_dir}/ckpt"``.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from roll.core.config.yaml_tree import Sources, join, nearest_source, rebase_sources
from roll.core.errors import ConfigError, ConfigIssue

_REF = re.compile(r"(\\?)\$\{([^${}]*)\}")
_ENV_RESOLVERS = ("env", "oc.env")
_MISSING = object()


class _Unresolved(Exception):
    """One failed reference; carries the message (and hint) of the issue to report."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def interpolate(
    data: dict[str, Any], sources: Sources, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], Sources]:
    """Resolve every ``${...}`` in ``data`` (in place) and return it with its sources.

    ``environ`` defaults to ``os.environ``. Raises :class:`ConfigError` with one issue per failing key.
    """
    resolver = _Resolver(data, sources, os.environ if environ is None else environ)
    resolver.resolve("")
    if resolver.issues:
        raise ConfigError(issues=resolver.issues)
    return data, sources


class _Resolver:
    """Depth-first, memoised resolution. ``active`` is the chain of paths being resolved, to detect cycles;
    a container counts as depending on its children, so ``a: {b: ${a}}`` is a cycle too."""

    def __init__(self, data: dict[str, Any], sources: Sources, environ: Mapping[str, str]) -> None:
        self.data = data
        self.sources = sources
        self.environ = environ
        self.issues: list[ConfigIssue] = []
        self.done: set[str] = set()
        self.active: list[str] = []

    def resolve(self, path: str) -> None:
        """Resolve the value at ``path`` and everything under it, in place."""
        if path in self.done:
            return
        self.active.append(path)
        value = _get(self.data, path)
        if isinstance(value, dict | list):
            for key in list(value.keys()) if isinstance(value, dict) else range(len(value)):
                self.resolve(join(path, key))
        elif isinstance(value, str) and "${" in value:
            self._resolve_string(path, value)
        self.active.pop()
        self.done.add(path)

    def _resolve_string(self, path: str, text: str) -> None:
        try:
            whole = _REF.fullmatch(text)
            if whole and not whole.group(1):
                new = self._lookup(whole.group(2).strip(), path)
                self._copy_sources(whole.group(2).strip(), path, new)
            else:
                new = _REF.sub(lambda m: self._embed(m, path), text)
                if "${" in _REF.sub("", text):
                    raise _Unresolved(f"unterminated or nested interpolation in {text!r}")
        except _Unresolved as exc:
            where = nearest_source(self.sources, path)
            self.issues.append(ConfigIssue(path, exc.message, exc.hint, where))
            return
        _set(self.data, path, new)

    def _embed(self, match: re.Match[str], path: str) -> str:
        if match.group(1):
            return match.group(0)[1:]
        value = self._lookup(match.group(2).strip(), path)
        if isinstance(value, dict | list):
            kind = "mapping" if isinstance(value, dict) else "list"
            raise _Unresolved(
                f"${{{match.group(2)}}} is a {kind} and cannot be part of a string",
                hint="reference it as the whole value, or point at one of its scalar keys",
            )
        return _format_scalar(value)

    def _lookup(self, ref: str, referrer: str) -> Any:
        resolver, colon, arg = ref.partition(":")
        if colon and resolver.strip() in _ENV_RESOLVERS:
            return self._env(arg)
        if colon:
            raise _Unresolved(f"unknown resolver {resolver!r} in ${{{ref}}}", hint="known: env")
        if not ref or _get(self.data, ref) is _MISSING:
            raise _Unresolved(f"${{{ref}}} refers to a key that does not exist", hint=self._did_you_mean(ref))
        if ref in self.active:
            cycle = " -> ".join([*self.active[self.active.index(ref) :], ref])
            raise _Unresolved(f"interpolation cycle: {cycle}")
        self.resolve(ref)
        return copy.deepcopy(_get(self.data, ref))

    def _env(self, arg: str) -> str:
        name, comma, default = arg.partition(",")
        name = name.strip()
        if name in self.environ:
            return self.environ[name]
        if comma:
            return default.strip()
        raise _Unresolved(
            f"environment variable {name!r} is not set",
            hint=f"export {name}=..., or give a default: ${{env:{name},default}}",
        )

    def _copy_sources(self, ref: str, referrer: str, value: Any) -> None:
        """A copied mapping or list keeps the locations where its keys were written."""
        if isinstance(value, dict | list):
            moved = rebase_sources(self.sources, ref, referrer)
            moved.pop(referrer, None)
            self.sources.update(moved)

    def _did_you_mean(self, ref: str) -> str | None:
        close = difflib.get_close_matches(ref, list(_paths(self.data, "")), n=3, cutoff=0.6)
        return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else None


def _format_scalar(value: Any) -> str:
    """How a scalar reads inside a string: as YAML would write it (``true``, ``null``), else ``str``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def _get(data: Any, path: str) -> Any:
    """The value at ``path`` or ``_MISSING``. Digits index lists."""
    node = data
    for part in path.split(".") if path else ():
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    parent_path, _, key = path.rpartition(".")
    parent = _get(data, parent_path)
    if isinstance(parent, list):
        parent[int(key)] = value
    else:
        parent[key] = value


def _paths(node: Any, prefix: str) -> Iterator[str]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        path = join(prefix, key)
        yield path
        yield from _paths(child, path)
