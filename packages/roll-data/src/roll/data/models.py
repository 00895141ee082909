"""Model references as configs write them: a tiny preset name (text or vision-language), a local folder or a hub id.

:func:`resolve_model_path` maps a reference to what ``from_pretrained`` should get (a preset to its cached folder,
built once); :func:`missing_model_path` says why a local-looking reference cannot be a model, touching nothing but
the file system. It sits above :mod:`roll.data.tiny` and :mod:`roll.data.tiny_vl`, which know only their own
presets. Importing it imports neither torch nor transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from roll.core.errors import DataError
from roll.data.tiny import PRESETS, is_preset, tiny_model_path
from roll.data.tiny_vl import VL_PRESETS, is_vl_preset, tiny_vl_model_path


def resolve_model_path(name_or_path: str) -> str:
    """Map a model reference to what ``from_pretrained`` should get.

    A preset name (``tiny-10m``) becomes its cached folder; an existing local path is returned as given; a
    reference that looks local (absolute, ``./``, ``../``, ``~``, more than one ``/``) but does not exist raises
    :class:`DataError` naming it (instead of a confusing hub lookup); anything else is taken for a hub id and
    returned unchanged.
    """
    if is_preset(name_or_path):
        return str(tiny_model_path(name_or_path))
    if is_vl_preset(name_or_path):
        return str(tiny_vl_model_path(name_or_path))
    problem = missing_model_path(name_or_path)
    if problem is not None:
        raise DataError(problem)
    return name_or_path


def missing_model_path(name_or_path: str) -> str | None:
    """Why ``name_or_path`` cannot be a model, or ``None``: a reference that looks local (absolute, ``./``,
    ``../``, ``~``, more than one ``/``) but does not exist. Presets, existing paths and hub ids pass (a hub id is
    never fetched to check it). Reads nothing but the file system's entries; builds no preset."""
    path = Path(name_or_path).expanduser()
    if is_preset(name_or_path) or name_or_path in VL_PRESETS or path.exists():
        return None
    looks_local = (
        path.is_absolute()
        or name_or_path.startswith((".", "~"))
        or name_or_path.count("/") > 1
        or "\\" in name_or_path
    )
    if not looks_local:
        return None
    return (
        f"model path {name_or_path!r} does not exist; pass an existing folder, a hub id like 'org/name', "
        f"or a tiny preset ({', '.join(sorted([*PRESETS, *VL_PRESETS]))})"
    )


def load_image_processor(path: str) -> Any:
    """The image processor of a model folder or hub id (``AutoImageProcessor``; a tiny preset name resolves to its
    folder first). Not ``AutoProcessor``: for Qwen2-VL that also builds the video processor, which needs
    torchvision; images need only this and the tokenizer, and so do videos, whose frames this processor encodes
    (:mod:`roll.data.video`)."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(resolve_model_path(path))  # type: ignore[no-untyped-call]
    except (OSError, ValueError) as err:
        raise DataError(f"could not load the image processor of {path!r}: {err}") from err


def is_vision_language(path: str) -> bool:
    """Whether the model at ``path`` (folder, hub id or preset) is a vision-language one (its config has a
    ``vision_config``)."""
    import json

    if is_vl_preset(path):
        return True
    local = Path(resolve_model_path(path)) / "config.json"
    if local.is_file():
        return "vision_config" in json.loads(local.read_text())
    from transformers import AutoConfig

    return hasattr(AutoConfig.from_pretrained(path), "vision_config")
