"""What a vision-language forward needs beside the token ids: merged image and video tensors and 3-D rotary
positions.

Images and videos travel per row (columns :data:`~roll.core.columns.VISION_COLUMNS`, see :mod:`roll.data.vision`
and :mod:`roll.data.video`), as Python lists inside a micro-batch dict, so every row split keeps them with their
rows. :func:`vision_inputs` turns one micro-batch's lists into the model's keyword arguments: ``pixel_values`` /
``image_grid_thw`` and ``pixel_values_videos`` / ``video_grid_thw`` concatenated in row order, and the Qwen2-VL
family's multimodal rotary positions ``position_ids [3, B, T]`` from the model's own ``get_rope_index`` (image
and video tokens get (time, row, column) positions, text after them continues from the largest of them). The
strategies pass explicit positions everywhere (training, scoring, the decode loop), so computing them here keeps
train, score and generate on one layout, the one ``model.generate`` and vLLM use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from roll.core import columns as C
from roll.core.errors import WorkerError
from roll.data.vision import collate_videos, collate_vision

Vision = Mapping[str, Sequence[Any]]
"""Per-row vision columns: ``{PIXEL_VALUES: [tensor | None] * B, IMAGE_GRID_THW: [tensor | None] * B}`` and,
for videos, ``PIXEL_VALUES_VIDEOS`` / ``VIDEO_GRID_THW`` alike (a missing pair: no row has one)."""


def vision_of(batch: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The per-row vision lists of a micro-batch dict (``{}`` when it has none or no row has an image or video)."""
    out = {k: list(batch[k]) for k in C.VISION_COLUMNS if k in batch and isinstance(batch[k], list | tuple)}
    return out if has_media(out) else {}


def has_media(vision: Vision | None) -> bool:
    """Whether any row of per-row vision columns has an image or a video."""
    return any(
        p is not None for k in (C.PIXEL_VALUES, C.PIXEL_VALUES_VIDEOS) for p in (vision or {}).get(k, ())
    )


def take_vision(vision: Vision | None, index: Sequence[int]) -> dict[str, list[Any]]:
    """Rows ``index`` (in that order) of per-row vision columns (``{}`` for none)."""
    return {k: [v[i] for i in index] for k, v in (vision or {}).items()}


def slice_vision(vision: Vision | None, lo: int, hi: int) -> dict[str, list[Any]]:
    """Rows ``lo:hi`` of per-row vision columns (``{}`` for none)."""
    return {k: list(v[lo:hi]) for k, v in (vision or {}).items()}


def vision_inputs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: Vision | None
) -> dict[str, torch.Tensor]:
    """``pixel_values``/``image_grid_thw`` (rows with images), ``pixel_values_videos``/``video_grid_thw`` (rows
    with videos) and ``position_ids [3, B, T]`` for ``model`` on these rows; ``{}`` when no row has either (the
    text path is then unchanged)."""
    if not vision:
        return {}
    images = collate_vision(vision.get(C.PIXEL_VALUES, ()), vision.get(C.IMAGE_GRID_THW, ()))
    videos = collate_videos(vision.get(C.PIXEL_VALUES_VIDEOS, ()), vision.get(C.VIDEO_GRID_THW, ()))
    if not images and not videos:
        return {}
    config = getattr(model, "config", None)
    rope_index = getattr(getattr(model, "model", None), "get_rope_index", None)
    image_id, video_id = (getattr(config, n, None) for n in ("image_token_id", "video_token_id"))
    if rope_index is None or image_id is None or (videos and video_id is None):
        raise WorkerError(
            f"the batch has images or videos but {type(model).__name__} is not a vision-language model of the "
            "Qwen2-VL family (no model.get_rope_index / config.image_token_id / config.video_token_id); load a VLM "
            "(AutoModelForImageTextToText)"
        )
    device, merge = input_ids.device, _merge_size(model)
    # mm_token_type_ids: text 0, image 1, video 2 (get_rope_index reads each span's grid by its type)
    image_BT = (input_ids == image_id).int()
    video_BT = (input_ids == video_id).int() if video_id is not None else torch.zeros_like(image_BT)
    _check_tokens(image_BT * attention_mask, vision.get(C.IMAGE_GRID_THW), merge, "image")
    _check_tokens(video_BT * attention_mask, vision.get(C.VIDEO_GRID_THW), merge, "video")
    grids = {k: v.to(device) for k, v in {**images, **videos}.items() if k.endswith("grid_thw")}
    position_ids, _ = rope_index(
        input_ids,
        image_BT + 2 * video_BT,
        image_grid_thw=grids.get("image_grid_thw"),
        video_grid_thw=grids.get("video_grid_thw"),
        attention_mask=attention_mask,
    )
    dtype = next(model.parameters()).dtype
    pixels = {
        k: v.to(device=device, dtype=dtype) for k, v in {**images, **videos}.items() if k.startswith("pixel")
    }
    return {**pixels, **grids, "position_ids": position_ids}


def _merge_size(model: torch.nn.Module) -> int:
    vision_config = getattr(getattr(model, "config", None), "vision_config", None)
    return int(getattr(vision_config, "spatial_merge_size", 1) or 1)


def _check_tokens(tokens_BT: torch.Tensor, grids: Sequence[Any] | None, merge: int, noun: str) -> None:
    """Each row holds as many image (video) tokens as its images (videos) fill (``t * h * w / merge**2`` each);
    else the model's rotary index would read the next row's grid. Raises naming the row and both counts."""
    found = tokens_BT.sum(-1).tolist()
    for row, n in enumerate(found):
        grid = grids[row] if grids is not None else None
        want = 0 if grid is None else int((grid.prod(-1) // merge**2).sum())
        if n != want:
            raise WorkerError(
                f"row {row} holds {n} {noun} tokens but its {noun}s fill {want}: a response that contains a "
                f"vision marker (<|{noun}_pad|>) cannot be scored; the sampler must never emit vision tokens "
                "(hf bans them)"
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


VIDEO_FPS = 2.0
"""The frame rate a row's frames are said to have when vLLM asks (its Qwen2.5-VL processor needs video metadata;
Qwen2-VL ignores it): rows give frames already chosen, so the value only scales temporal positions there."""


def multimodal_prompt(
    ids: Sequence[int],
    images: Sequence[Any] | None,
    pad_id: int | None,
    videos: Sequence[Any] | None = None,
    video_pad_id: int | None = None,
) -> dict[str, Any]:
    """A vLLM prompt: ``{"prompt_token_ids"}``, plus ``multi_modal_data`` with ``"image": [PIL images]`` and
    ``"video": [(frames [F, H, W, 3] uint8, metadata)]`` (vLLM's video item with its metadata dict), the pads of
    each collapsed to one per item (vLLM's processor re-expands them from the media)."""
    data: dict[str, Any] = {}
    ids = list(ids)
    if images and pad_id is not None:
        from roll.data.vision import load_image

        data["image"] = [load_image(image, index=i) for i, image in enumerate(images)]
        ids = collapse_image_pads(ids, pad_id)
    if videos and video_pad_id is not None:
        data["video"] = [vllm_video(video, index=i) for i, video in enumerate(videos)]
        ids = collapse_image_pads(ids, video_pad_id)
    return {"prompt_token_ids": ids, "multi_modal_data": data} if data else {"prompt_token_ids": ids}


def vllm_video(video: Any, *, index: int = 0) -> tuple[Any, dict[str, Any]]:
    """One video as vLLM takes it: ``(frames [F, H, W, 3] uint8, metadata)``, the metadata saying the frames are
    already sampled (``do_sample_frames: False``) at :data:`VIDEO_FPS`."""
    import numpy as np

    from roll.data.video import load_video

    frames = np.stack([np.asarray(frame) for frame in load_video(video, index=index)])
    n = int(frames.shape[0])
    metadata = {
        "fps": VIDEO_FPS,
        "duration": n / VIDEO_FPS,
        "total_num_frames": n,
        "frames_indices": list(range(n)),
        "do_sample_frames": False,
    }
    return frames, metadata
