"""Compare: "Which is larger, 37 or 52?" -> "The answer is 52."

The easiest verifiable task there is, for smoke tests and for checking that RL moves the reward at all: a tiny
model can only succeed by copying the right one of two numbers from its prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from roll.core.errors import DataError
from roll.data.tasks.arithmetic import extract_answer, format_answer, verify_integer
from roll.data.tasks.base import Problem


@dataclass(frozen=True)
class CompareTask:
    """Two distinct integers of ``digits`` digits; the answer is the larger (or, if ``smaller``, the smaller)."""

    digits: int = 2
    smaller: bool = False
    name: str = "compare"
    tag: str = "compare"

    def __post_init__(self) -> None:
        if self.digits < 1:
            raise DataError(f"compare needs digits >= 1, got {self.digits}")

    def sample(self, rng: random.Random) -> Problem:
        low = 0 if self.digits == 1 else 10 ** (self.digits - 1)
        a, b = rng.sample(range(low, 10**self.digits), 2)
        word = "smaller" if self.smaller else "larger"
        answer = str(min(a, b) if self.smaller else max(a, b))
        return Problem(
            prompt=f"Which is {word}, {a} or {b}?",
            answer=answer,
            ground_truth=answer,
            tag=self.tag,
            key=f"{a},{b}",
        )

    def format_answer(self, answer: str) -> str:
        return format_answer(answer)

    def extract_answer(self, response: str) -> str | None:
        return extract_answer(response)

    def verify(self, response: str, ground_truth: str) -> bool:
        return verify_integer(response, ground_truth)

    def wrong_answer(self, problem: Problem, rng: random.Random) -> str:
        """The other number in the prompt: the mistake a model that copies blindly makes."""
        a, b = problem.key.split(",")
        return b if a == problem.answer else a
