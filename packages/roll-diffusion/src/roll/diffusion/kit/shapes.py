"""Captioned shapes: ``"a red circle on blue"`` rendered with PIL at ``size x size`` pixels.

A caption names an object colour, a shape and a background colour (all different colours). Rendering is
deterministic in ``(caption, seed)``: the seed moves and sizes the shape. No torch here.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
from PIL import Image, ImageDraw

from roll.core.errors import DataError

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 180, 40),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 30),
}
SHAPES = ("circle", "square", "triangle")
WORDS = ("a", "on", *COLORS, *SHAPES)
"""Every word a caption uses (the tiny tokenizer's vocabulary, after its special tokens)."""


def caption(color: str, shape: str, background: str) -> str:
    return f"a {color} {shape} on {background}"


def all_captions() -> list[str]:
    """The 36 captions: 4 object colours x 3 shapes x 3 other background colours."""
    return [caption(c, s, b) for c, s, b in itertools.product(COLORS, SHAPES, COLORS) if b != c]


def parse_caption(text: str) -> tuple[str, str, str]:
    """``(color, shape, background)`` of a kit caption; anything else raises naming the expected form."""
    words = text.strip().split()
    ok = (
        len(words) == 5
        and words[0] == "a"
        and words[3] == "on"
        and words[1] in COLORS
        and words[2] in SHAPES
        and words[4] in COLORS
    )
    if not ok:
        raise DataError(
            f"{text!r} is not a kit caption; expected 'a <color> <shape> on <color>' with colours "
            f"{sorted(COLORS)} and shapes {list(SHAPES)}"
        )
    return words[1], words[2], words[4]


def render(text: str, seed: int, size: int = 32) -> np.ndarray:
    """The caption drawn as a ``[size, size, 3]`` uint8 image."""
    color, shape, background = parse_caption(text)
    rng = random.Random(seed)
    image = Image.new("RGB", (size, size), COLORS[background])
    draw = ImageDraw.Draw(image)
    extent = rng.randint(size * 3 // 8, size * 5 // 8)
    x0 = rng.randint(1, size - extent - 1)
    y0 = rng.randint(1, size - extent - 1)
    box = (x0, y0, x0 + extent, y0 + extent)
    fill = COLORS[color]
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([(x0, y0 + extent), (x0 + extent, y0 + extent), (x0 + extent // 2, y0)], fill=fill)
    return np.asarray(image, dtype=np.uint8)


def labels(text: str) -> tuple[int, int, int]:
    """Class indices ``(color, shape, background)`` of a caption, for the scorer's three heads."""
    color, shape, background = parse_caption(text)
    names = list(COLORS)
    return names.index(color), SHAPES.index(shape), names.index(background)
