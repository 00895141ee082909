"""YAML composition through a top-level ``defaults:`` list, the subset of Hydra's that ROLL configs use.

Each entry of a file's ``defaults:`` list is one of

- ``base.yaml`` or ``../common/ray.yaml``: a file, relative to the including file, merged at the root
  (the ``.yaml`` suffix may be left out);
- ``model: tiny``: the group option ``<dir>/model/tiny.yaml``, placed under the key ``model``; a nested group
  ``optim/adam: fast`` lands under ``optim.adam``; ``model: null`` includes nothing;
- ``_self_``: where the file's own keys go in the merge order. Without it they go last, so a file overrides
  what it includes.

``name@pkg`` sets where an entry lands (``ray.yaml@cluster.ray``); ``@_here_`` and ``@_global_`` mean the root
of the including file, as in Hydra. Included files may have their own ``defaults:``; a file that includes
itself, directly or not, is a :class:`ConfigError` naming the cycle. Mappings merge deeply; every other value,
lists included, is replaced by the later one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll.core.config.yaml_tree import (
    Sources,
    deep_merge,
    display_path,
    read_yaml,
    rebase_sources,
    sources_under,
)
from roll.core.errors import ConfigError, ConfigIssue

_SELF = "_self_"
_ROOT_PACKAGES = ("", "_here_", "_global_")


@dataclass(frozen=True)
class _Include:
    """One resolved defaults entry: the file to compose and the dotted key it lands under (``""``: the root)."""

    file: Path
    package: str
    source: str


def compose(path: str | Path) -> tuple[dict[str, Any], Sources]:
    """Compose the file at ``path`` with everything its ``defaults:`` lists pull in, recursively."""
    return _compose_file(Path(path).absolute(), ())


def _compose_file(path: Path, stack: tuple[Path, ...]) -> tuple[dict[str, Any], Sources]:
    data, sources = read_yaml(path)
    if "defaults" not in data:
        return data, sources
    plan = _plan(data.pop("defaults"), path, sources)
    own_sources = dict(sources)
    for key in sources_under(sources, "defaults"):
        del own_sources[key]
    merged: dict[str, Any] = {}
    merged_sources: Sources = {"": sources[""]}
    for step in plan:
        if isinstance(step, _Include):
            part, part_sources = _include(step, (*stack, path))
        else:
            part, part_sources = data, own_sources
        deep_merge(merged, merged_sources, part, part_sources)
    return merged, merged_sources


def _include(step: _Include, stack: tuple[Path, ...]) -> tuple[dict[str, Any], Sources]:
    """Compose an included file and wrap it so that it sits under ``step.package``."""
    resolved = step.file.resolve()
    if resolved in (p.resolve() for p in stack):
        chain = " -> ".join(display_path(p) for p in (*stack, step.file))
        issue = ConfigIssue(path="defaults", message=f"defaults cycle: {chain}", source=step.source)
        raise ConfigError(issues=[issue])
    data, sources = _compose_file(step.file, stack)
    if not step.package:
        return data, sources
    moved = rebase_sources(sources, "", step.package)
    wrapped: dict[str, Any] = data
    keys = step.package.split(".")
    for depth in range(len(keys), 0, -1):
        wrapped = {keys[depth - 1]: wrapped}
        moved.setdefault(".".join(keys[:depth]), sources[""])
    return wrapped, moved


def _plan(entries: object, path: Path, sources: Sources) -> list[_Include | str]:
    """Turn a ``defaults:`` list into merge steps, reporting every bad entry at once."""
    where = sources.get("defaults", sources[""])
    if not isinstance(entries, list):
        kind = type(entries).__name__
        message = f"`defaults` must be a list of includes, not a {kind}"
        raise ConfigError(issues=[ConfigIssue(path="defaults", message=message, source=where)])
    steps: list[_Include | str] = []
    issues: list[ConfigIssue] = []
    for index, entry in enumerate(entries):
        entry_where = sources.get(f"defaults.{index}", where)
        step = _parse_entry(entry, path.parent, entry_where)
        if isinstance(step, ConfigIssue):
            issues.append(ConfigIssue(f"defaults.{index}", step.message, step.hint, entry_where))
        elif step is not None:
            steps.append(step)
    if issues:
        raise ConfigError(issues=issues)
    if _SELF not in steps:
        steps.append(_SELF)
    return steps


def _parse_entry(entry: object, here: Path, where: str) -> _Include | str | ConfigIssue | None:
    if entry == _SELF:
        return _SELF
    if isinstance(entry, str):
        name, package = _split_package(entry, default="")
        return _resolve(here / _with_suffix(name), package, where, group=None)
    if isinstance(entry, dict) and len(entry) == 1:
        ((key, option),) = entry.items()
        if option is None:
            return None
        if isinstance(key, str) and isinstance(option, str):
            group, package = _split_package(key, default=key.replace("/", "."))
            return _resolve(here / group / _with_suffix(option), package, where, group=here / group)
    return ConfigIssue(
        path="",
        message=f"a defaults entry must be a path (`- base.yaml`), `- group: option` or `- _self_`, not {entry!r}",
    )


def _split_package(text: str, default: str) -> tuple[str, str]:
    name, at, package = text.partition("@")
    if not at:
        return name, default
    return name, "" if package in _ROOT_PACKAGES else package


def _with_suffix(name: str) -> str:
    return name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"


def _resolve(file: Path, package: str, where: str, group: Path | None) -> _Include | ConfigIssue:
    if file.is_file():
        return _Include(file=file, package=package, source=where)
    hint = None
    if group is not None:
        options = sorted(p.stem for p in group.glob("*.y*ml")) if group.is_dir() else []
        hint = (
            f"options in {display_path(group)}/: {', '.join(options)}" if options else "that group is empty"
        )
    return ConfigIssue(path="", message=f"included file not found: {display_path(file)}", hint=hint)
