"""Images in rows: loading, vision tokens in the prompt, patch tensors beside the token ids, and their collation.

A row may carry ``images``: a list (or one value) of PIL images, file paths, raw bytes, or the ``{"bytes",
"path"}`` dicts a ``datasets`` ``Image`` feature gives. Text marks where each goes with ``<image>``; without any
marker, the images go at the start of the first user turn. Three pure steps turn such a row into model inputs:

1. :func:`place_image_tokens` (before the chat template renders): every ``<image>`` becomes Qwen2-VL's span
   ``<|vision_start|><|image_pad|><|vision_end|>``. The template then renders plain text, so any text template
   works (the tiny kit's ChatML, a real Qwen2-VL tokenizer's own).
2. :func:`encode_images`: the model's image processor turns the images into ``pixel_values`` ``[patches, D]`` and
   ``image_grid_thw`` ``[images, 3]``.
3. :func:`expand_image_pads` (after tokenization): each single ``<|image_pad|>`` id becomes as many ids as the
   image has merged patches (``t * h * w / merge**2``), never trained on (label ``-100``).

:func:`roll.data.media.attach_vision` applies 2 and 3 to tokenized rows and stores the tensors per row (columns
:data:`roll.core.columns.PIXEL_VALUES` and :data:`~roll.core.columns.IMAGE_GRID_THW`), so any row split (data
parallel, micro-batches) keeps each row's images with it; :func:`collate_vision` concatenates the rows of one
forward. Errors name the row, the image and the file.

Videos (a row's ``videos``, ``<video>`` markers) take the same three steps with ``<|video_pad|>`` and the columns
:data:`~roll.core.columns.PIXEL_VALUES_VIDEOS` / :data:`~roll.core.columns.VIDEO_GRID_THW`
(:func:`roll.data.media.place_vision_tokens`, :func:`roll.data.video.encode_videos`,
:func:`~roll.data.media.attach_vision`, :func:`collate_videos`); :mod:`roll.data.video` says how frames become
patches. :mod:`roll.data.media` holds the row-level steps that take both kinds, so this module never imports
:mod:`roll.data.video`.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roll.core import columns as C
from roll.core.columns import IGNORE_INDEX
from roll.core.errors import DataError

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image

IMAGE_PLACEHOLDER = "<image>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
IMAGE_SPAN = VISION_START + IMAGE_PAD + VISION_END
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)


def row_images(row: Mapping[str, Any]) -> list[Any]:
    """The row's ``images`` as a list (a single value becomes a list of one; missing or None: empty)."""
    value = row.get(C.IMAGES)
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def load_image(value: Any, *, row: int | None = None, index: int = 0, field: str = "images") -> Image:
    """An RGB PIL image from a PIL image, a path, bytes or a ``{"bytes", "path"}`` dict; errors name the row, the
    ``field`` (``images``, or a video's ``videos[v].frames``) with the index, and the file."""
    from PIL import Image as PILImage

    where = f"row {row}: {field}[{index}]" if row is not None else f"{field}[{index}]"
    if isinstance(value, PILImage.Image):
        return value.convert("RGB")
    if isinstance(value, Mapping):
        if value.get("bytes"):
            return _open(io.BytesIO(value["bytes"]), f"{where} (bytes of {value.get('path') or 'an image'})")
        value = value.get("path")
    if isinstance(value, bytes | bytearray):
        return _open(io.BytesIO(value), f"{where} (bytes)")
    if isinstance(value, str | Path):
        path = Path(value).expanduser()
        if not path.is_file():
            raise DataError(
                f"{where}: image file {str(value)!r} does not exist; fix the path or drop the row"
            )
        return _open(path, f"{where}: file {str(value)!r}")
    raise DataError(
        f"{where}: an image must be a PIL image, a path, bytes or a {{bytes, path}} dict, got {value!r}"
    )


def _open(source: Any, where: str) -> Image:
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    try:
        with PILImage.open(source) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"{where} is not a readable image ({type(exc).__name__}: {exc})") from exc


def place_image_tokens(
    messages: Sequence[Mapping[str, str]], num_images: int, *, row: int | None = None
) -> list[dict[str, str]]:
    """``messages`` with each ``<image>`` replaced by the vision span; images without markers lead the first user
    turn. More markers than images, or fewer (but some), raise naming the row."""
    return place_spans(messages, num_images, IMAGE_PLACEHOLDER, IMAGE_SPAN, "image", row=row)


def place_spans(
    messages: Sequence[Mapping[str, str]],
    n: int,
    marker: str,
    span: str,
    noun: str,
    *,
    row: int | None = None,
) -> list[dict[str, str]]:
    """Each ``marker`` replaced by ``span``; without markers, ``n`` spans lead the first user turn. A marker count
    that is neither 0 nor ``n`` raises naming the row and both counts."""
    count = sum(m["content"].count(marker) for m in messages)
    where = f"row {row}" if row is not None else "a row"
    if count > n or 0 < count < n:
        raise DataError(
            f"{where}: the text has {count} {marker} placeholder(s) but the row has {n} {noun}(s); give one "
            f"{noun} per placeholder (or no placeholders: {noun}s then lead the first user turn)"
        )
    out = [{"role": m["role"], "content": m["content"].replace(marker, span)} for m in messages]
    if count == 0 and n:
        first_user = next((i for i, m in enumerate(out) if m["role"] == "user"), None)
        if first_user is None:
            raise DataError(f"{where}: {n} {noun}(s) but no user turn to put them in")
        out[first_user]["content"] = span * n + out[first_user]["content"]
    return out


def tokens_per_image(grid_thw: torch.Tensor, merge_size: int) -> list[int]:
    """How many ``<|image_pad|>`` ids each image fills: ``t * h * w // merge_size**2`` (``grid_thw`` ``[n, 3]``)."""
    return [int(n) for n in (grid_thw.prod(-1) // (merge_size**2)).tolist()]


def expand_image_pads(
    ids: Sequence[int],
    counts: Sequence[int],
    pad_id: int,
    labels: Sequence[int] | None = None,
    *,
    row: int | None = None,
    noun: str = "image",
) -> tuple[list[int], list[int] | None]:
    """Each ``pad_id`` of ``ids`` repeated ``counts[i]`` times (labels there: -100). The number of pads must equal
    the number of images (``noun``: or videos); otherwise the error names the row and both counts."""
    found = sum(1 for t in ids if t == pad_id)
    if found != len(counts):
        where = f"row {row}" if row is not None else "a row"
        raise DataError(
            f"{where}: the tokenized prompt has {found} {noun} placeholder token(s) but the row has {len(counts)} "
            f"{noun}(s) (was it truncated, or did the text hold <|{noun}_pad|> itself?)"
        )
    out_ids: list[int] = []
    out_labels: list[int] | None = [] if labels is not None else None
    pads = iter(counts)
    for i, t in enumerate(ids):
        n = next(pads) if t == pad_id else 1
        out_ids += [t] * n
        if out_labels is not None and labels is not None:
            out_labels += [IGNORE_INDEX] * n if t == pad_id else [labels[i]]
    return out_ids, out_labels


def encode_images(images: Sequence[Image], image_processor: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pixel_values [patches, D], image_grid_thw [images, 3])`` of ``images`` by the model's image processor."""
    out = image_processor(images=list(images), return_tensors="pt")
    return out["pixel_values"].float(), out["image_grid_thw"].long()


Encoded = tuple["torch.Tensor", "torch.Tensor"]


def encode_row_images(images: Sequence[Any], image_processor: Any, *, row: int) -> Encoded:
    """Load (errors name the row, the image and the file) and encode one row's images."""
    return encode_images([load_image(v, row=row, index=i) for i, v in enumerate(images)], image_processor)


def has_vision(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any row carries encoded images or videos."""
    return any(r.get(C.PIXEL_VALUES) is not None or r.get(C.PIXEL_VALUES_VIDEOS) is not None for r in rows)


def vision_columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The per-row vision columns of ``rows`` (for a Batch's non-tensor columns); empty when no row has images or
    videos."""
    if not has_vision(rows):
        return {}
    return {name: [r.get(name) for r in rows] for name in C.VISION_COLUMNS}


def collate_vision(
    pixel_values: Sequence[torch.Tensor | None], image_grid_thw: Sequence[torch.Tensor | None]
) -> dict[str, torch.Tensor]:
    """A forward's ``pixel_values`` ``[sum patches, D]`` and ``image_grid_thw`` ``[sum images, 3]`` from per-row
    values (in row order, rows without images skipped); ``{}`` when no row has images."""
    return _cat_rows(pixel_values, image_grid_thw, "pixel_values", "image_grid_thw")


def collate_videos(
    pixel_values_videos: Sequence[torch.Tensor | None], video_grid_thw: Sequence[torch.Tensor | None]
) -> dict[str, torch.Tensor]:
    """:func:`collate_vision` for videos: ``pixel_values_videos`` and ``video_grid_thw``."""
    return _cat_rows(pixel_values_videos, video_grid_thw, "pixel_values_videos", "video_grid_thw")


def _cat_rows(
    pixels: Sequence[torch.Tensor | None],
    grids: Sequence[torch.Tensor | None],
    pixels_key: str,
    grid_key: str,
) -> dict[str, torch.Tensor]:
    import torch

    kept = [p for p in pixels if p is not None]
    if not kept:
        return {}
    return {pixels_key: torch.cat(kept), grid_key: torch.cat([g for g in grids if g is not None])}
