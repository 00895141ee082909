"""Shapes: a visual task with verifiable answers, drawn with PIL when a problem is drawn (no files, no hub).

Each problem is one small image of coloured shapes on black and a question about it; the answer is one word or
one number, taught in the one format ``"The answer is red."``. Difficulty levels (:meth:`ShapesTask.level`):

====== ============================================================ ========= ==========================
level  question                                                     image     answers
====== ============================================================ ========= ==========================
0      "What colour is the shape?" (one shape)                      32 x 32   red, green, blue
1      "What shape is it?" (one shape)                              32 x 32   square, circle, triangle
2      "How many <colour> shapes are there?" (1-4 shapes, 2 colours) 48 x 48   0 .. 4
3      "What colour is the shape at the <top left>?" (2 x 2 grid)    32 x 32   red, green, blue, yellow
====== ============================================================ ========= ==========================

Sizes are multiples of 16 (the tiny kit's patch 8 times merge 2), so no image is resized. A problem's key is its
scene and question, so the train/eval split (by key hash, :func:`roll.data.tasks.base.split_of`) never shares a
picture-and-question between splits, and a seed fixes every pixel.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Literal

from roll.core.errors import DataError
from roll.data.tasks.base import Problem

Question = Literal["colour", "shape", "count", "position"]
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (60, 90, 240),
    "yellow": (235, 215, 40),
}
SHAPES = ("square", "circle", "triangle")
CELLS = ("top left", "top right", "bottom left", "bottom right")
ANSWER_TEMPLATE = "The answer is {answer}."
_ANSWER_IS = re.compile(r"answer is\s*([a-z0-9]+)", re.IGNORECASE)
_WORD = re.compile(r"[a-z0-9]+", re.IGNORECASE)

# (question, number of colours, image size, most shapes) per level
_LEVELS: dict[int, tuple[Question, int, int, int]] = {
    0: ("colour", 3, 32, 1),
    1: ("shape", 3, 32, 1),
    2: ("count", 2, 48, 4),
    3: ("position", 4, 32, 4),
}

Shape = tuple[str, str, int, int, int]
"""``(shape, colour, centre x, centre y, radius)``."""


def draw(shapes: list[Shape], size: int) -> Any:
    """An RGB PIL image ``size`` x ``size`` of ``shapes`` on black."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (0, 0, 0))
    pen = ImageDraw.Draw(image)
    for kind, colour, x, y, r in shapes:
        fill = COLOURS[colour]
        if kind == "square":
            pen.rectangle((x - r, y - r, x + r, y + r), fill=fill)
        elif kind == "circle":
            pen.ellipse((x - r, y - r, x + r, y + r), fill=fill)
        else:
            pen.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fill)
    return image


@dataclass(frozen=True)
class ShapesTask:
    """Questions about a drawn scene; see the module docstring for the levels."""

    question: Question = "colour"
    colours: int = 3
    size: int = 32
    max_shapes: int = 1
    name: str = "shapes"
    tag: str = "shapes"

    def __post_init__(self) -> None:
        if self.question not in ("colour", "shape", "count", "position"):
            raise DataError(
                f"shapes: unknown question {self.question!r}; use colour, shape, count or position"
            )
        if not 1 <= self.colours <= len(COLOURS):
            raise DataError(f"shapes: colours must be 1..{len(COLOURS)}, got {self.colours}")
        if self.size % 16 or self.size < 32:
            raise DataError(f"shapes: size must be a multiple of 16 and >= 32, got {self.size}")

    @classmethod
    def level(cls, level: int) -> ShapesTask:
        """A named difficulty, 0 (colour of one shape) to 3 (colour at a grid position)."""
        if level not in _LEVELS:
            raise DataError(f"unknown shapes level {level}; known levels are {sorted(_LEVELS)}")
        question, colours, size, most = _LEVELS[level]
        return cls(question=question, colours=colours, size=size, max_shapes=most)

    @property
    def palette(self) -> list[str]:
        return list(COLOURS)[: self.colours]

    def sample(self, rng: random.Random) -> Problem:
        if self.question in ("colour", "shape"):
            shapes, text, answer = self._single(rng)
        elif self.question == "count":
            shapes, text, answer = self._count(rng)
        else:
            shapes, text, answer = self._position(rng)
        key = f"{self.question}:{self.size}:{sorted(shapes)}:{text}"
        return Problem(
            prompt=f"<image>{text}", answer=answer, ground_truth=answer, tag=self.tag, key=key,
            images=(draw(shapes, self.size),),
        )  # fmt: skip

    def _single(self, rng: random.Random) -> tuple[list[Shape], str, str]:
        r = rng.randint(self.size // 5, self.size // 3)
        x, y = rng.randint(r, self.size - 1 - r), rng.randint(r, self.size - 1 - r)
        shape = (rng.choice(SHAPES), rng.choice(self.palette), x, y, r)
        if self.question == "colour":
            return [shape], "What colour is the shape?", shape[1]
        return [shape], "What shape is it?", shape[0]

    def _cells(self, rng: random.Random, grid: int, count: int) -> list[tuple[int, int, int]]:
        """``count`` distinct cells of a ``grid`` x ``grid`` layout as ``(centre x, centre y, radius)``."""
        step = self.size // grid
        picked = rng.sample(range(grid * grid), count)
        out = []
        for cell in picked:
            r = rng.randint(step // 4, step // 2 - 2)
            cx = (cell % grid) * step + step // 2 + rng.randint(-1, 1)
            cy = (cell // grid) * step + step // 2 + rng.randint(-1, 1)
            out.append((cx, cy, r))
        return out

    def _count(self, rng: random.Random) -> tuple[list[Shape], str, str]:
        n = rng.randint(1, self.max_shapes)
        shapes = [
            (rng.choice(SHAPES), rng.choice(self.palette), x, y, r) for x, y, r in self._cells(rng, 3, n)
        ]
        asked = rng.choice(self.palette)
        answer = sum(1 for s in shapes if s[1] == asked)
        return shapes, f"How many {asked} shapes are there?", str(answer)

    def _position(self, rng: random.Random) -> tuple[list[Shape], str, str]:
        step = self.size // 2
        n = rng.randint(1, min(self.max_shapes, 4))
        cells = rng.sample(range(4), n)
        shapes: list[Shape] = []
        for cell in cells:
            r = rng.randint(step // 4, step // 2 - 2)
            x, y = (cell % 2) * step + step // 2, (cell // 2) * step + step // 2
            shapes.append((rng.choice(SHAPES), rng.choice(self.palette), x, y, r))
        which = rng.randrange(n)
        return shapes, f"What colour is the shape at the {CELLS[cells[which]]}?", shapes[which][1]

    def answers(self) -> list[str]:
        """Every answer this task can have."""
        if self.question == "shape":
            return list(SHAPES)
        if self.question == "count":
            return [str(i) for i in range(self.max_shapes + 1)]
        return self.palette

    def format_answer(self, answer: str) -> str:
        return ANSWER_TEMPLATE.format(answer=answer)

    def extract_answer(self, response: str) -> str | None:
        """The word after the last ``answer is``, else the last word that is a possible answer, else None."""
        matches = _ANSWER_IS.findall(response)
        if matches:
            return str(matches[-1]).lower()
        known = set(self.answers())
        words = [w.lower() for w in _WORD.findall(response) if w.lower() in known]
        return words[-1] if words else None

    def verify(self, response: str, ground_truth: str) -> bool:
        return self.extract_answer(response) == ground_truth.strip().lower()

    def wrong_answer(self, problem: Problem, rng: random.Random) -> str:
        return rng.choice([a for a in self.answers() if a != problem.answer])
