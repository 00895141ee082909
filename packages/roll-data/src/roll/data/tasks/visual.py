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
4      video: "What colour is the shape in the last frame?"         2-4 x 32² red, green, blue
5      video: "Which way does the shape move?"                      2-4 x 32² left, right, up, down
====== ============================================================ ========= ==========================

Levels 4 and 5 are videos (a row's ``videos``, :mod:`roll.data.video`): one shape over 2 to ``frames`` frames.
At level 4 it moves and changes colour every frame (never the same colour twice in a row), so the frame before
the last always names a wrong colour; at level 5 it keeps its colour and moves a few pixels a frame in one direction, which no
single frame shows.

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

Question = Literal["colour", "shape", "count", "position", "last_colour", "direction"]
VIDEO_QUESTIONS = ("last_colour", "direction")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (60, 90, 240),
    "yellow": (235, 215, 40),
}
SHAPES = ("square", "circle", "triangle")
CELLS = ("top left", "top right", "bottom left", "bottom right")
DIRECTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
ANSWER_TEMPLATE = "The answer is {answer}."
_ANSWER_IS = re.compile(r"answer is\s*([a-z0-9]+)", re.IGNORECASE)
_WORD = re.compile(r"[a-z0-9]+", re.IGNORECASE)

# (question, number of colours, image size, most shapes) per level
_LEVELS: dict[int, tuple[Question, int, int, int]] = {
    0: ("colour", 3, 32, 1),
    1: ("shape", 3, 32, 1),
    2: ("count", 2, 48, 4),
    3: ("position", 4, 32, 4),
    4: ("last_colour", 3, 32, 1),
    5: ("direction", 3, 32, 1),
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
    frames: int = 4
    """Video questions: most frames per video (each problem draws 2..frames)."""
    name: str = "shapes"
    tag: str = "shapes"

    def __post_init__(self) -> None:
        if self.question not in ("colour", "shape", "count", "position", *VIDEO_QUESTIONS):
            raise DataError(
                f"shapes: unknown question {self.question!r}; use colour, shape, count, position, last_colour "
                "or direction"
            )
        if self.question in VIDEO_QUESTIONS and not 2 <= self.frames <= 8:
            raise DataError(f"shapes: frames must be 2..8 for a video question, got {self.frames}")
        if not 1 <= self.colours <= len(COLOURS):
            raise DataError(f"shapes: colours must be 1..{len(COLOURS)}, got {self.colours}")
        if self.size % 16 or self.size < 32:
            raise DataError(f"shapes: size must be a multiple of 16 and >= 32, got {self.size}")

    @classmethod
    def level(cls, level: int) -> ShapesTask:
        """A named difficulty, 0 (colour of one shape) to 3 (colour at a grid position); 4 and 5 are videos."""
        if level not in _LEVELS:
            raise DataError(f"unknown shapes level {level}; known levels are {sorted(_LEVELS)}")
        question, colours, size, most = _LEVELS[level]
        return cls(question=question, colours=colours, size=size, max_shapes=most)

    @property
    def palette(self) -> list[str]:
        return list(COLOURS)[: self.colours]

    def sample(self, rng: random.Random) -> Problem:
        if self.question in VIDEO_QUESTIONS:
            return self._video(rng)
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

    def _video(self, rng: random.Random) -> Problem:
        """One shape over 2..frames frames; the question needs more than one of them (module docstring)."""
        n = rng.randint(2, self.frames)
        kind, r = rng.choice(SHAPES), rng.randint(self.size // 8, self.size // 6)
        direction = rng.choice(list(DIRECTIONS))
        (dx, dy), step = DIRECTIONS[direction], rng.randint(3, 5)
        span = step * (n - 1)  # the whole path stays inside the frame
        lo_x, hi_x = r + max(0, -dx * span), self.size - 1 - r - max(0, dx * span)
        lo_y, hi_y = r + max(0, -dy * span), self.size - 1 - r - max(0, dy * span)
        x, y = rng.randint(lo_x, hi_x), rng.randint(lo_y, hi_y)
        colours = [rng.choice(self.palette)]
        for _ in range(n - 1):
            others = [c for c in self.palette if c != colours[-1]]
            colours.append(colours[0] if self.question == "direction" else rng.choice(others))
        scenes = [[(kind, c, x + dx * step * i, y + dy * step * i, r)] for i, c in enumerate(colours)]
        if self.question == "last_colour":
            text, answer = "What colour is the shape in the last frame?", colours[-1]
        else:
            text, answer = "Which way does the shape move?", direction
        key = f"{self.question}:{self.size}:{scenes}:{text}"
        frames = tuple(draw(scene, self.size) for scene in scenes)
        return Problem(
            prompt=f"<video>{text}",
            answer=answer,
            ground_truth=answer,
            tag=self.tag,
            key=key,
            videos=(frames,),
        )

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
        if self.question == "direction":
            return list(DIRECTIONS)
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
