"""Rows with images and videos: the row-level steps that take both kinds, over :mod:`roll.data.vision` (images, the
shared vision spans and pads) and :mod:`roll.data.video` (frames).

:func:`place_vision_tokens` puts a row's image and video spans into its messages before the chat template renders;
:func:`attach_vision` encodes a tokenized row's images and videos and expands their pads. Errors name the row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from roll.core import columns as C
from roll.core.errors import DataError
from roll.data.video import VIDEO_PLACEHOLDER, VIDEO_SPAN, encode_row_videos, row_videos
from roll.data.vision import (
    Encoded,
    encode_row_images,
    expand_image_pads,
    place_image_tokens,
    place_spans,
    row_images,
    tokens_per_image,
)


def place_vision_tokens(
    messages: Sequence[Mapping[str, str]], row: Mapping[str, Any], *, index: int | None = None
) -> list[dict[str, str]]:
    """``messages`` with the row's image and video spans in place: unmarked images lead the first user turn, then
    unmarked videos. Videos are placed whenever the row has a ``videos`` column (even an empty one), so a
    ``<video>`` marker without its video is an error; images only when the row has some, as before."""
    out = [dict(m) for m in messages]
    if C.VIDEOS in row:
        out = place_spans(out, len(row_videos(row)), VIDEO_PLACEHOLDER, VIDEO_SPAN, "video", row=index)
    images = row_images(row)
    return place_image_tokens(out, len(images), row=index) if images else out


def attach_vision(
    rows: Sequence[dict[str, Any]],
    image_processor: Any,
    *,
    image_pad_id: int,
    video_pad_id: int | None = None,
    source: str = "data",
) -> list[dict[str, Any]]:
    """Tokenized rows with their images and videos encoded: ``pixel_values``/``image_grid_thw`` and
    ``pixel_values_videos``/``video_grid_thw`` per row, the pads of ``prompt_ids`` (prompt rows) or
    ``input_ids``/``labels`` (SFT rows) expanded, ``length`` updated.

    Rows without images (videos) get ``None`` in that pair. Videos need ``video_pad_id`` (their frames are encoded
    by :func:`roll.data.video.encode_videos` with the same image processor). ``source`` names the data in errors.
    """
    merge = int(getattr(image_processor, "merge_size", 1) or 1)
    out = []
    for index, row in enumerate(rows):
        new = dict(row)
        videos = row_videos(row)
        if videos and video_pad_id is None:
            raise DataError(f"{source}: row {index} has videos but no video pad id was given", row=index)
        image_pair = _encoded(row_images(row), index, source, encode_row_images, image_processor)
        _attach_one(new, index, source, "image", image_pad_id, merge, C.IMAGE_COLUMNS, image_pair)
        video_pair = _encoded(videos, index, source, encode_row_videos, image_processor)
        _attach_one(new, index, source, "video", video_pad_id, merge, C.VIDEO_COLUMNS, video_pair)
        out.append(new)
    return out


def _encoded(
    items: Sequence[Any], index: int, source: str, encode: Callable[..., Encoded], image_processor: Any
) -> Encoded | None:
    if not items:
        return None
    try:
        return encode(items, image_processor, row=index)
    except DataError as err:
        raise DataError(f"{source}: {err}", row=index) from err


def _attach_one(
    row: dict[str, Any],
    index: int,
    source: str,
    noun: str,
    pad_id: int | None,
    merge: int,
    columns: tuple[str, str],
    encoded: Encoded | None,
) -> None:
    """One modality of :func:`attach_vision`: its two columns (``None`` without items) and its pads expanded."""
    pixels_col, grid_col = columns
    row[pixels_col], row[grid_col] = None, None
    if encoded is not None and pad_id is not None:
        pixels, grid = encoded
        _expand_row(row, tokens_per_image(grid, merge), pad_id, index, source, noun)
        row[pixels_col], row[grid_col] = pixels, grid
    elif pad_id is not None and any(t == pad_id for t in _ids_of(row)):
        raise DataError(f"{source}: row {index} has {noun} placeholder tokens but no {noun}s", row=index)


def _ids_of(row: Mapping[str, Any]) -> list[int]:
    return list(row.get("prompt_ids") or row.get("input_ids") or [])


def _expand_row(
    row: dict[str, Any], counts: list[int], pad_id: int, index: int, source: str, noun: str = "image"
) -> None:
    try:
        if "prompt_ids" in row:
            row["prompt_ids"], _ = expand_image_pads(row["prompt_ids"], counts, pad_id, row=index, noun=noun)
            row["length"] = len(row["prompt_ids"])
        else:
            ids, labels = expand_image_pads(
                row["input_ids"], counts, pad_id, row["labels"], row=index, noun=noun
            )
            row["input_ids"], row["labels"], row["length"] = ids, labels, len(ids)
    except DataError as err:
        raise DataError(f"{source}: {err}", row=index) from err
