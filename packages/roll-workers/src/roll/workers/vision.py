"""What a vision-language forward needs beside the token ids: merged image tensors and 3-D rotary positions.

Images travel per row (columns :data:`~roll.core.columns.PIXEL_VALUES` and
:data:`~roll.core.columns.IMAGE_GRID_THW`, see :mod:`roll.data.vision`), as Python lists inside a micro-batch
dict, so every row split keeps them with their rows. :func:`vision_inputs` turns one micro-batch's lists into
the model's keyword arguments: ``pixel_values`` and ``image_grid_thw`` concatenated in row order, and the
Qwen2-VL family's multimodal rotary positions ``position_ids [3, B, T]`` from the model's own ``get_rope_index``
(image tokens get (time, row, column) positions, text after an image continues from the largest of them). The
strategies pass explicit positions everywhere (training, scoring, the decode loop), so computing them here keeps
train, score and generate on one layout, the one ``model.generate`` and vLLM use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from roll.core import columns as C
from roll.core.errors import WorkerError
from roll.data.vision import collate_vision

Vision = Mapping[str, Sequence[Any]]
"""Per-row vision columns: ``{PIXEL_VALUES: [tensor | None] * B, IMAGE_GRID_THW: [tensor | None] * B}``."""


def vision_of(batch: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The per-row vision lists of a micro-batch dict (``{}`` when it has none or no row has an image)."""
    out = {k: list(batch[k]) for k in C.VISION_COLUMNS if k in batch and isinstance(batch[k], list | tuple)}
    if len(out) != len(C.VISION_COLUMNS) or all(p is None for p in out[C.PIXEL_VALUES]):
        return {}
    return out


def take_vision(vision: Vision | None, index: Sequence[int]) -> dict[str, list[Any]]:
    """Rows ``index`` (in that order) of per-row vision columns (``{}`` for none)."""
    return {k: [v[i] for i in index] for k, v in (vision or {}).items()}


def slice_vision(vision: Vision | None, lo: int, hi: int) -> dict[str, list[Any]]:
    """Rows ``lo:hi`` of per-row vision columns (``{}`` for none)."""
    return {k: list(v[lo:hi]) for k, v in (vision or {}).items()}


def vision_inputs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: Vision | None
) -> dict[str, torch.Tensor]:
    """``pixel_values``, ``image_grid_thw`` and ``position_ids [3, B, T]`` for ``model`` on these rows; ``{}``
    when no row has an image (the text path is then unchanged)."""
    if not vision:
        return {}
    merged = collate_vision(vision[C.PIXEL_VALUES], vision[C.IMAGE_GRID_THW])
    if not merged:
        return {}
    inner = getattr(model, "model", None)
    rope_index = getattr(inner, "get_rope_index", None)
    image_token_id = getattr(getattr(model, "config", None), "image_token_id", None)
    if rope_index is None or image_token_id is None:
        raise WorkerError(
            f"the batch has images but {type(model).__name__} is not a vision-language model of the Qwen2-VL "
            "family (no model.get_rope_index / config.image_token_id); load a VLM (AutoModelForImageTextToText)"
        )
    device = input_ids.device
    grid = merged["image_grid_thw"].to(device)
    mm_types = (input_ids == image_token_id).int()
    _check_image_tokens(mm_types * attention_mask, vision[C.IMAGE_GRID_THW], _merge_size(model))
    position_ids, _ = rope_index(input_ids, mm_types, image_grid_thw=grid, attention_mask=attention_mask)
    dtype = next(model.parameters()).dtype
    return {
        "pixel_values": merged["pixel_values"].to(device=device, dtype=dtype),
        "image_grid_thw": grid,
        "position_ids": position_ids,
    }


def _merge_size(model: torch.nn.Module) -> int:
    vision_config = getattr(getattr(model, "config", None), "vision_config", None)
    return int(getattr(vision_config, "spatial_merge_size", 1) or 1)


def _check_image_tokens(image_BT: torch.Tensor, grids: Sequence[Any], merge: int) -> None:
    """Each row holds as many image tokens as its images fill (``t * h * w / merge**2`` each); else the model's
    rotary index would read the next row's grid. Raises naming the row and both counts."""
    found = image_BT.sum(-1).tolist()
    for row, (n, grid) in enumerate(zip(found, grids)):
        want = 0 if grid is None else int((grid.prod(-1) // merge**2).sum())
        if n != want:
            raise WorkerError(
                f"row {row} holds {n} image tokens but its images fill {want}: a response that contains a vision "
                "marker (<|image_pad|>) cannot be scored; the sampler must never emit vision tokens (hf bans them)"
            )


def vision_token_ids(model: torch.nn.Module) -> list[int]:
    """The ids of a vision-language model's image and video markers (``[]`` for a text model). A response must
    never hold them: a sampled ``<|image_pad|>`` has no picture behind it, so the trainer's forward could not place
    one (the image count no longer matches the grids). The one list of what is never sampled: the hf decode loop
    and vLLM (``logit_bias``) ban these ids, and with ``score_without_vision_tokens`` the scorers
    (:func:`roll.workers.logprobs.forward_scores`) renormalize without them, so a sample's log-prob and its score
    agree."""
    return config_vision_token_ids(getattr(model, "config", None))


def config_vision_token_ids(config: Any) -> list[int]:
    """:func:`vision_token_ids` from a model's config (what the vllm strategy has: ``AutoConfig`` of its path)."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    found = [getattr(config, n, None) for n in names]
    return [int(i) for i in found if i is not None] if getattr(config, "vision_config", None) else []


def next_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """``[B]`` position of the token after the last column, for 2-D ``[B, T]`` or 3-D ``[3, B, T]`` positions
    (the last column of a left-padded prompt is text, whose three axes are equal)."""
    last = position_ids[0, :, -1] if position_ids.dim() == 3 else position_ids[:, -1]
    return last + 1


def collapse_image_pads(ids: Sequence[int], pad_id: int) -> list[int]:
    """Each run of ``pad_id`` as one id: the prompt form engines that expand images themselves (vLLM) expect."""
    out: list[int] = []
    for t in ids:
        if not (t == pad_id and out and out[-1] == pad_id):
            out.append(t)
    return out


def multimodal_prompt(ids: Sequence[int], images: Sequence[Any] | None, pad_id: int | None) -> dict[str, Any]:
    """A vLLM prompt: ``{"prompt_token_ids"}``, plus ``multi_modal_data: {"image": [PIL images]}`` with the image
    pads collapsed (vLLM's processor re-expands them from the images) when the prompt has images."""
    if not images or pad_id is None:
        return {"prompt_token_ids": list(ids)}
    from roll.data.vision import load_image

    loaded = [load_image(image, index=i) for i, image in enumerate(images)]
    return {"prompt_token_ids": collapse_image_pads(ids, pad_id), "multi_modal_data": {"image": loaded}}
