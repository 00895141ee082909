"""Pictures of grid worlds for image observations: flat cells of a fixed size plus inset squares for pieces.

The grid envs (FrozenLake, Sokoban) draw their state with :func:`draw_grid`: each cell is a ``cell_px`` square
filled with its tile colour; a piece standing on a cell (a player, a box) is a smaller square of its own colour,
inset ``inset_px`` pixels from each edge of the cell, so the tile under it stays visible as a frame. The picture
is a pure function of its arguments, hence deterministic per env seed. Pillow is imported only when drawing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from roll.agentic.types import EnvError

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = ["RGB", "Cell", "draw_grid"]

RGB = tuple[int, int, int]
Cell = tuple[int, int]


def draw_grid(
    tiles_RC: Sequence[Sequence[RGB]], cell_px: int, pieces: Mapping[Cell, RGB], inset_px: int
) -> Image:
    """An RGB image ``C * cell_px`` wide and ``R * cell_px`` high: cell ``(r, c)`` covers pixels
    ``[r * cell_px, (r + 1) * cell_px)`` down and ``[c * cell_px, (c + 1) * cell_px)`` across, filled with
    ``tiles_RC[r][c]``; a piece at ``(r, c)`` fills that square shrunk by ``inset_px`` on every side."""
    from PIL import Image, ImageDraw

    if not tiles_RC or len({len(row) for row in tiles_RC}) != 1 or not 0 <= 2 * inset_px < cell_px:
        raise EnvError(
            f"draw_grid needs equal-length rows and 0 <= 2 * inset_px < cell_px; got "
            f"{[len(row) for row in tiles_RC]} row lengths, cell_px={cell_px}, inset_px={inset_px}"
        )
    image = Image.new("RGB", (len(tiles_RC[0]) * cell_px, len(tiles_RC) * cell_px))
    draw = ImageDraw.Draw(image)
    for r, row in enumerate(tiles_RC):
        for c, colour in enumerate(row):
            draw.rectangle(_square((r, c), cell_px, 0), fill=colour)
    for cell, colour in pieces.items():
        draw.rectangle(_square(cell, cell_px, inset_px), fill=colour)
    return image


def _square(cell: Cell, cell_px: int, inset_px: int) -> tuple[int, int, int, int]:
    # PIL rectangles include both corners, hence the -1 on the far edges.
    r, c = cell
    return (
        c * cell_px + inset_px,
        r * cell_px + inset_px,
        (c + 1) * cell_px - 1 - inset_px,
        (r + 1) * cell_px - 1 - inset_px,
    )
