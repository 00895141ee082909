"""The one seam between roll and its plugins: Python entry points.

Every training mode, strategy, reward, environment, tool and tracker is found through
``importlib.metadata.entry_points`` in one of the groups of :data:`roll.core.types.GROUPS`. This module is the
only place that reads them, so the rules hold everywhere:

- an unknown name raises :class:`PluginError` listing what is installed;
- one name offered by two distributions raises, naming both;
- an entry point whose import fails says which extra of its distribution brings the missing module;
- a loaded object is checked against its group's spec type (and its ``name`` must match) when discovered;
- nothing here ever returns ``None``.
"""

from __future__ import annotations

import importlib.metadata as md
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from roll.core.errors import PluginError
from roll.core.types import GROUPS


@dataclass(frozen=True)
class PluginInfo:
    """An entry point, not yet loaded: where it is and who ships it."""

    group: str
    name: str
    value: str
    dist: str
    version: str


def _check_group(group: str) -> None:
    if group not in GROUPS:
        raise PluginError(f"unknown plugin group {group!r}; roll's groups are: {', '.join(sorted(GROUPS))}")


def available(group: str) -> dict[str, PluginInfo]:
    """Every entry point of ``group`` by name, without importing anything. Duplicate names raise."""
    _check_group(group)
    found: dict[str, PluginInfo] = {}
    for ep in md.entry_points(group=group):
        dist = ep.dist.name if ep.dist is not None else "<unknown>"
        version = ep.dist.version if ep.dist is not None else "?"
        info = PluginInfo(group, ep.name, ep.value, dist, version)
        prior = found.get(ep.name)
        if prior is not None and (prior.dist, prior.value) != (info.dist, info.value):
            raise PluginError(
                f"plugin name {ep.name!r} in group {group!r} is defined twice: by {prior.dist} {prior.version} "
                f"({prior.value}) and by {info.dist} {info.version} ({info.value}); uninstall one of them"
            )
        found[ep.name] = info
    return found


def load(group: str, name: str) -> Any:
    """Import the plugin ``name`` of ``group`` and return its checked spec object."""
    infos = available(group)
    info = infos.get(name)
    if info is None:
        known = ", ".join(sorted(infos)) or "(none installed)"
        raise PluginError(f"no {group} plugin named {name!r}; installed: {known}")
    return _load_checked(info)


def load_all(group: str) -> dict[str, Any]:
    """Every plugin of ``group``, loaded and checked."""
    return {name: _load_checked(info) for name, info in sorted(available(group).items())}


@cache
def _load_checked(info: PluginInfo) -> Any:
    ep = md.EntryPoint(name=info.name, value=info.value, group=info.group)
    try:
        obj = ep.load()
    except ImportError as exc:
        raise PluginError(_import_failure(info, exc)) from exc
    _check_spec(info, obj)
    return obj


def _check_spec(info: PluginInfo, obj: Any) -> None:
    spec_type = GROUPS[info.group]
    where = f"{info.group} plugin {info.name!r} ({info.value}, from {info.dist} {info.version})"
    if not isinstance(obj, spec_type):
        raise PluginError(f"{where} is a {type(obj).__name__}, not a {spec_type.__name__}")
    spec_name = getattr(obj, "name", None)
    if spec_name != info.name:
        raise PluginError(
            f"{where} calls itself {spec_name!r}; the entry point name and spec name must agree"
        )
    if not callable(getattr(obj, "build", None)):
        raise PluginError(f"{where} has no callable build")


def _import_failure(info: PluginInfo, exc: ImportError) -> str:
    missing = exc.name or ""
    text = f"{info.group} plugin {info.name!r} from {info.dist} failed to import: {exc}"
    extra = _extra_providing(info.dist, missing)
    if extra:
        text += f"; install the extra that provides it: pip install '{info.dist}[{extra}]'"
    elif missing:
        text += f"; install the package that provides module {missing!r}"
    return text


def _extra_providing(dist: str, module: str) -> str | None:
    """The extra of ``dist`` whose requirements include a package named like ``module`` (vllm, megatron...)."""
    if not module:
        return None
    top = _normalize(module.split(".")[0])
    try:
        requires = md.distribution(dist).requires or []
    except md.PackageNotFoundError:
        return None
    for req in requires:
        match = re.match(r"\s*([A-Za-z0-9_.\-]+).*extra\s*==\s*['\"]([^'\"]+)['\"]", req)
        if match and top in _normalize(match.group(1)):
            return match.group(2)
    return None


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "", name).lower()
