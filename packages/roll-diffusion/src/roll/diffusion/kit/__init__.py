"""The offline tiny diffusion kit: rendered captioned shapes, a tiny text-to-image stack warmed on them, a tiny
colour/shape scorer, and a tiny video stack of the Wan family.

- :mod:`.shapes`: the captions (``"a red circle on blue"``), their parsing, and PIL rendering (no torch).
- :mod:`.tiny`: the tiny stack built from configs (``UNet2DConditionModel``, ``AutoencoderKL``,
  ``CLIPTextModel`` with a word-level tokenizer) and its warm-up, cached as a diffusers folder.
- :mod:`.video`: the tiny Wan stack (``WanTransformer3DModel``, ``AutoencoderKLWan``, a T5 encoder), unwarmed.

``model.path: tiny-sd`` (or ``tiny-wan``) works like a hub id: :func:`resolve_diffusion_path` maps it to the
cached folder. Nothing here downloads anything.
"""

from __future__ import annotations

from pathlib import Path

from roll.core.errors import DataError

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
