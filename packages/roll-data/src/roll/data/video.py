"""Videos in rows: frames loaded and checked, then encoded as Qwen2-VL's video patches.

A row may carry ``videos``: a list of videos, each a list of frames (any form
:func:`roll.data.vision.load_image` accepts: PIL images, paths, bytes, ``{"bytes", "path"}`` dicts), or the path
of a folder of frames (its image files in name order) or of an animated image (a GIF's frames). Text marks
where each goes with ``<video>``, which becomes ``<|vision_start|><|video_pad|><|vision_end|>``; unmarked videos
lead the first user turn, after the images (:func:`roll.data.media.place_vision_tokens`). After tokenization
each ``<|video_pad|>`` becomes ``t * h * w / merge**2`` ids, never trained on
(:func:`~roll.data.media.attach_vision`).

Encoding (:func:`encode_videos`): ``pixel_values_videos [patches, C * T * p * p]`` and ``video_grid_thw
[videos, 3]`` with ``t = frames / T`` (``T`` the temporal patch size, 2 for Qwen2-VL). **An odd frame count
repeats the last frame** to fill the last temporal patch, as transformers' ``Qwen2VLVideoProcessor.patchify``
does. Each frame goes through the model's *image* processor (its resize, rescale and normalize); that processor
already writes every patch as ``(C, T, p, p)`` with the one image copied ``T`` times along ``T`` (its
``patchify`` broadcasts it), so :func:`video_patches_from_frames` only takes one copy per frame and lays
consecutive frames along ``T``, temporal patch by temporal patch: the layout of the video processor (patch order
``(t, h / m, w / m, m, m)``, features ``(C, T, p, p)``). Hence a two-frame video of one frame equals that frame's
image encoding, which the tests check.

Why not transformers' ``Qwen2VLVideoProcessor``: it imports torchvision, which the lock lacks. torchvision 0.29.2
does resolve from PyPI against the lock's torch 2.15.0 (a 7.4 MB wheel), but it would add a dependency and an
import to every data and worker process for one reshape, and what else the video processor does (decoding files,
sampling frames by fps) does not apply: rows give their frames already chosen. The cost of our path: frames are
resized with the image processor's pixel bounds, not a real Qwen2-VL video processor's (which default larger).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roll.core import columns as C
from roll.core.errors import DataError
from roll.data.vision import VIDEO_PAD, VISION_END, VISION_START, encode_images, load_image

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image

VIDEO_PLACEHOLDER = "<video>"
VIDEO_SPAN = VISION_START + VIDEO_PAD + VISION_END
FRAME_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})


def row_videos(row: Mapping[str, Any]) -> list[Any]:
    """The row's ``videos`` as a list of videos (missing or None: empty; a bare path: one video)."""
    value = row.get(C.VIDEOS)
    if value is None:
        return []
    return [value] if isinstance(value, str | Path) else list(value)


def load_video(value: Any, *, row: int | None = None, index: int = 0) -> list[Image]:
    """The RGB frames of one video: a list of frames, or the path of a folder of frames or of an animated image.

    Raises :class:`DataError` naming the row, the video index, the frame index and the file for an unreadable
    frame, and for a video without frames or with frames of different sizes."""
    where = f"row {row}: videos[{index}]" if row is not None else f"videos[{index}]"
    if isinstance(value, str | Path):
        frames: list[Any] = _frames_at(Path(value).expanduser(), where)
    elif isinstance(value, list | tuple):
        frames = list(value)
    else:
        raise DataError(
            f"{where}: a video must be a list of frames or the path of a folder of frames or a GIF, got {value!r}"
        )
    if not frames:
        raise DataError(f"{where}: the video has no frames; give at least one frame or drop the row")
    loaded = [load_image(f, row=row, index=i, field=f"videos[{index}].frames") for i, f in enumerate(frames)]
    for i, frame in enumerate(loaded[1:], start=1):
        if frame.size != loaded[0].size:
            raise DataError(
                f"{where}: frame {i} is {frame.size[0]}x{frame.size[1]} but frame 0 is "
                f"{loaded[0].size[0]}x{loaded[0].size[1]}; every frame of a video must have one size"
            )
    return loaded


def _frames_at(path: Path, where: str) -> list[Any]:
    """A folder's image files in name order, or an animated image's frames (as RGB PIL images)."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix.lower() in FRAME_SUFFIXES)
    if not path.is_file():
        raise DataError(f"{where}: video path {str(path)!r} does not exist; fix the path or drop the row")
    from PIL import Image as PILImage
    from PIL import ImageSequence, UnidentifiedImageError

    try:
        with PILImage.open(path) as image:
            return [frame.convert("RGB") for frame in ImageSequence.Iterator(image)]
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(
            f"{where}: file {str(path)!r} is not a readable animated image ({type(exc).__name__}: {exc})"
        ) from exc


def encode_row_videos(videos: Sequence[Any], image_processor: Any, *, row: int) -> tuple[Any, Any]:
    """Load (errors name the row, video, frame and file) and encode one row's videos."""
    return encode_videos([load_video(v, row=row, index=i) for i, v in enumerate(videos)], image_processor)


def encode_videos(
    videos: Sequence[Sequence[Image]], image_processor: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pixel_values_videos [patches, D], video_grid_thw [videos, 3])`` of ``videos`` (lists of same-size
    frames), each frame through the model's image processor; see the module docstring for the layout."""
    import torch

    temporal = int(getattr(image_processor, "temporal_patch_size", 1) or 1)
    pixels, grids = [], []
    for frames in videos:
        frame_pixels, frame_grid = encode_images(list(frames), image_processor)
        _, h, w = (int(n) for n in frame_grid[0].tolist())
        per_frame = frame_pixels.reshape(len(frames), h * w, -1)  # [F, S, C * T * p * p]
        patches = video_patches_from_frames(per_frame, temporal)
        pixels.append(patches)
        grids.append([patches.shape[0] // (h * w), h, w])
    return torch.cat(pixels), torch.tensor(grids, dtype=torch.long)


def video_patches_from_frames(
    frames_FSD: torch.Tensor, temporal_patch_size: int, *, channels: int = 3
) -> torch.Tensor:
    """``[t * S, D]`` video patches from ``frames_FSD`` ``[F, S, D]``: each frame's image patches, whose features
    ``D = C * T * p * p`` hold the frame ``T`` times along ``T``. Frames ``k*T .. k*T + T-1`` fill temporal patch
    ``k``; an odd count (not a multiple of ``T``) repeats the last frame, so ``t = ceil(F / T)``."""
    import torch

    F, S, D = frames_FSD.shape
    T = temporal_patch_size
    if pad := -F % T:
        frames_FSD = torch.cat([frames_FSD, frames_FSD[-1:].expand(pad, S, D)])
    t = frames_FSD.shape[0] // T
    area = D // (channels * T)
    one_copy = frames_FSD.reshape(t * T, S, channels, T, area)[:, :, :, 0]  # [t*T, S, C, p*p]
    grouped = one_copy.reshape(t, T, S, channels, area)
    return grouped.permute(0, 2, 3, 1, 4).reshape(t * S, D)  # [t, S, C, T, p*p] -> [t * S, D]
