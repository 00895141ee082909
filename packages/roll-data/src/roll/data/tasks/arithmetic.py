"""Arithmetic: integer expressions with +, - and *, optionally parenthesised, and an exact integer answer.

Kept short on purpose ("What is 23+45?" -> "The answer is 68.") because the tiny offline models must learn it on
a CPU in minutes: no spaces inside the expression, and the offline tokenizer gives every digit its own token.
Difficulty grows with the number of digits per operand, the number of operators, ``*``, and parentheses;
:meth:`ArithmeticTask.level` names a ladder of settings.

Answers are checked by value (``"068"`` equals ``"68"``); see :func:`extract_answer` for what a reply may look like.
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass

from roll.core.errors import DataError
from roll.data.tasks.base import Problem

ANSWER_TEMPLATE = "The answer is {answer}."
_ANSWER_IS = re.compile(r"answer is\s*(-?\d+)", re.IGNORECASE)
_INTEGER = re.compile(r"-?\d+")

# (digits, num_ops, operators, parentheses) per level; level 2 is the default the built-in runs train on.
_LEVELS: dict[int, tuple[int, int, str, bool]] = {
    0: (1, 1, "+", False),  # the 100 one-digit sums: small enough for a ~1M model to learn in minutes
    1: (1, 1, "+-", False),
    2: (2, 1, "+-", False),
    3: (2, 1, "+-*", False),
    4: (2, 2, "+-*", False),
    5: (2, 2, "+-*", True),
    6: (3, 3, "+-*", True),
}


def format_answer(answer: str) -> str:
    """The one reply format the built-in integer tasks teach: ``"The answer is 68."``."""
    return ANSWER_TEMPLATE.format(answer=answer)


def extract_answer(response: str) -> str | None:
    """The integer a reply gives: the last ``answer is N`` if present, else the last integer, else ``None``.

    The fallback makes rewards usable before a model has learnt the exact format; the format itself is taught
    by SFT data, which always uses :data:`ANSWER_TEMPLATE`.
    """
    matches = _ANSWER_IS.findall(response)
    if matches:
        return str(matches[-1])
    numbers = _INTEGER.findall(response)
    return str(numbers[-1]) if numbers else None


def verify_integer(response: str, ground_truth: str) -> bool:
    """Whether the integer ``response`` gives equals ``ground_truth`` by value."""
    got = extract_answer(response)
    return got is not None and int(got) == int(ground_truth)


def evaluate(expression: str) -> int:
    """Exact value of an integer expression of ``+ - *``, parentheses and unary minus; anything else is refused.

    Parses with :mod:`ast` instead of calling ``eval`` so a ground truth can never execute code.
    """
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise DataError(f"not an arithmetic expression: {expression!r}") from exc
    return _eval_node(tree.body, expression)


def _eval_node(node: ast.expr, source: str) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_node(node.operand, source)
    if isinstance(node, ast.BinOp):
        left, right = _eval_node(node.left, source), _eval_node(node.right, source)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
    raise DataError(f"unsupported element {ast.dump(node)} in arithmetic expression {source!r}")


@dataclass(frozen=True)
class ArithmeticTask:
    """Expressions of ``num_ops + 1`` operands of ``digits`` digits joined by ``operators``.

    ``parentheses`` wraps a random inner run of operands in half of the multi-operator problems. Operands with
    ``digits == 1`` range over 0-9; wider ones have exactly ``digits`` digits (no leading zeros).
    """

    digits: int = 2
    num_ops: int = 1
    operators: str = "+-"
    parentheses: bool = False
    name: str = "arithmetic"
    tag: str = "arithmetic"

    def __post_init__(self) -> None:
        if self.digits < 1 or self.num_ops < 1:
            raise DataError(
                f"arithmetic needs digits >= 1 and num_ops >= 1, got {self.digits}, {self.num_ops}"
            )
        if not self.operators or set(self.operators) - set("+-*"):
            raise DataError(
                f"arithmetic operators must be a non-empty subset of '+-*', got {self.operators!r}"
            )

    @classmethod
    def level(cls, level: int) -> ArithmeticTask:
        """A named difficulty: 0 (one-digit sums), 1 (one-digit +/-) ... 6 (three digits, three operators, parentheses)."""
        if level not in _LEVELS:
            raise DataError(f"unknown arithmetic level {level}; known levels are {sorted(_LEVELS)}")
        digits, num_ops, operators, parentheses = _LEVELS[level]
        return cls(digits=digits, num_ops=num_ops, operators=operators, parentheses=parentheses)

    def _operand(self, rng: random.Random) -> str:
        low = 0 if self.digits == 1 else 10 ** (self.digits - 1)
        return str(rng.randint(low, 10**self.digits - 1))

    def expression(self, rng: random.Random) -> str:
        """One random expression string, e.g. ``"12*(3+45)"``."""
        operands = [self._operand(rng) for _ in range(self.num_ops + 1)]
        ops = [rng.choice(self.operators) for _ in range(self.num_ops)]
        if self.parentheses and self.num_ops >= 2 and rng.random() < 0.5:
            start = rng.randrange(0, self.num_ops)  # a run of 2..num_ops operands, never the whole expression
            end = rng.randrange(start + 1, min(start + self.num_ops, self.num_ops + 1))
            operands[start] = "(" + operands[start]
            operands[end] = operands[end] + ")"
        parts = [operands[0]]
        for op, operand in zip(ops, operands[1:]):
            parts += [op, operand]
        return "".join(parts)

    def sample(self, rng: random.Random) -> Problem:
        expr = self.expression(rng)
        answer = str(evaluate(expr))
        return Problem(prompt=f"What is {expr}?", answer=answer, ground_truth=answer, tag=self.tag, key=expr)

    def format_answer(self, answer: str) -> str:
        return format_answer(answer)

    def extract_answer(self, response: str) -> str | None:
        return extract_answer(response)

    def verify(self, response: str, ground_truth: str) -> bool:
        return verify_integer(response, ground_truth)

    def wrong_answer(self, problem: Problem, rng: random.Random) -> str:
        """The right answer off by a near miss: ±1, ±2, ±10 or a flipped sign."""
        right = int(problem.answer)
        candidates = [right + d for d in (1, -1, 2, -2, 10, -10)]
        if right != 0:
            candidates.append(-right)
        return str(rng.choice(candidates))
