"""Kit presets as model paths: ``tiny-sd`` and ``tiny-wan`` work like hub ids.

:func:`resolve_diffusion_path` maps a preset to its cached diffusers folder (built on first use);
:func:`missing_diffusion_path` is the start-up check that builds nothing. Nothing here downloads anything.
"""

from __future__ import annotations

from pathlib import Path

from roll.core.errors import DataError

__all__ = ["PRESETS", "missing_diffusion_path", "resolve_diffusion_path"]

PRESETS = ("tiny-sd", "tiny-wan")


def resolve_diffusion_path(name_or_path: str) -> str:
    """A kit preset becomes its cached folder (built on first use); any other name passes through."""
    if name_or_path == "tiny-sd":
        from roll.diffusion.kit.tiny import tiny_sd_path

        return str(tiny_sd_path())
    if name_or_path == "tiny-wan":
        from roll.diffusion.kit.video import tiny_wan_path

        return str(tiny_wan_path())
    problem = missing_diffusion_path(name_or_path)
    if problem is not None:
        raise DataError(problem)
    return name_or_path


def missing_diffusion_path(name_or_path: str) -> str | None:
    """Why ``name_or_path`` names no diffusers folder (a local-looking path that does not exist), else ``None``;
    builds no preset. The start-up check of ``roll validate`` and ``roll train`` (before Ray starts)."""
    path = Path(name_or_path).expanduser()
    if name_or_path in PRESETS or not name_or_path.startswith((".", "/", "~")) or path.exists():
        return None
    return (
        f"model path {name_or_path!r} does not exist; pass a diffusers folder, a hub id like "
        f"'org/name', or a kit preset ({', '.join(PRESETS)})"
    )
