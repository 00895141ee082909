"""Pictures a run writes: a PNG grid of samples, a frame strip and GIF for videos, and a reward curve (PIL only,
so roll-diffusion needs no plotting library)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def grid_HW3(images_BHW3: np.ndarray, columns: int, pad: int = 2) -> np.ndarray:
    """Images ``[B, H, W, 3]`` (uint8) tiled into rows of ``columns``, ``pad`` white pixels between them."""
    b, h, w, _ = images_BHW3.shape
    cols = min(columns, b)
    rows = -(-b // cols)
    out = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, 3), 255, dtype=np.uint8)
    for i, img in enumerate(images_BHW3):
        r, c = divmod(i, cols)
        y, x = pad + r * (h + pad), pad + c * (w + pad)
        out[y : y + h, x : x + w] = img
    return out


def pixel_diversity(images_BHW3: np.ndarray) -> float:
    """Mean over pairs ``i < j`` of the RMS difference of images (or videos, ``[B, F, H, W, 3]``) ``i`` and
    ``j``, pixels in [0, 1]: 0 when every sample is the same picture (a collapsed generator), about 0.4 between
    two of the kit's renders with different colours."""
    flat_BD = images_BHW3.reshape(len(images_BHW3), -1).astype(np.float64) / 255.0
    if len(flat_BD) < 2:
        return 0.0
    sq_BB = ((flat_BD[:, None, :] - flat_BD[None, :, :]) ** 2).mean(-1)
    upper = np.triu_indices(len(flat_BD), k=1)
    return float(np.sqrt(sq_BB[upper]).mean())


def save_grid(images_BHW3: np.ndarray, columns: int, path: Path, scale: int = 4) -> Path:
    """The grid as a PNG, enlarged ``scale`` times (nearest) so 16-pixel samples are visible."""
    path.parent.mkdir(parents=True, exist_ok=True)
    grid = Image.fromarray(grid_HW3(images_BHW3, columns))
    grid.resize((grid.width * scale, grid.height * scale), Image.Resampling.NEAREST).save(path)
    return path


def save_video(videos_BFHW3: np.ndarray, strip: Path, gif: Path, scale: int = 4) -> tuple[Path, Path]:
    """One row per video, one column per frame (PNG strip), and an animated GIF of the videos side by side."""
    b, f = videos_BFHW3.shape[:2]
    save_grid(videos_BFHW3.reshape(b * f, *videos_BFHW3.shape[2:]), f, strip, scale)
    frames = [Image.fromarray(grid_HW3(videos_BFHW3[:, i], b)) for i in range(f)]
    frames = [fr.resize((fr.width * scale, fr.height * scale), Image.Resampling.NEAREST) for fr in frames]
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=200, loop=0)
    return strip, gif


def save_curve(
    series: Mapping[str, Sequence[tuple[int, float]]], path: Path, size: tuple[int, int] = (480, 300)
) -> Path:
    """Line plot of ``{name: [(step, value), ...]}`` with min/max labels and a legend."""
    colors = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = 50, 20, size[0] - 10, size[1] - 30
    points = [p for s in series.values() for p in s]
    if not points:
        image.save(path)
        return path
    x0, x1 = float(min(p[0] for p in points)), float(max(p[0] for p in points))
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1e-6)
    draw.rectangle((left, top, right, bottom), outline="black")
    for value, y in ((y0, bottom), (y1, top)):
        draw.text((2, y - 6), f"{value:.3g}", fill="black")
    draw.text((left, bottom + 6), f"step {x0:g}", fill="black")
    draw.text((right - 60, bottom + 6), f"step {x1:g}", fill="black")
    for i, (name, pts) in enumerate(series.items()):
        xy = [
            (left + (s - x0) / (x1 - x0) * (right - left), bottom - (v - y0) / (y1 - y0) * (bottom - top))
            for s, v in pts
        ]
        color = colors[i % len(colors)]
        if len(xy) > 1:
            draw.line(xy, fill=color, width=2)
        for px, py in xy:
            draw.ellipse((px - 2, py - 2, px + 2, py + 2), fill=color)
        draw.text((left + 8, top + 4 + 12 * i), name, fill=color)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path
