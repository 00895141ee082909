"""Countdown: reach a target number from given numbers with + - * / and parentheses, each number at most once.

The agent may think, call the calculator tool (when built with :func:`make_countdown`, the env is wrapped in a
:class:`~roll.agentic.tools.wrapper.ToolEnvWrapper` with a calculator), and submits ``<answer>expr</answer>``.

Rewards: ``correct_reward`` (1) for an expression that uses only the given numbers, each at most once, only
``+ - * /`` and parentheses, and equals the target exactly (rational arithmetic, so ``8 / 3 * 3`` is 8);
``wrong_answer_reward`` (0) for any other submitted answer. Either ends the episode. An output without an answer
tag earns ``format_error_reward`` and the episode continues until ``max_steps``.

Problems are generated solvable: the target is the value of a random expression over a random subset of the
numbers whose intermediate values are positive integers; that expression is in ``info["solution"]``.
"""

from __future__ import annotations

import ast
import random
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from pydantic import Field, model_validator

from roll.agentic.parsing import parse_action
from roll.agentic.tools.calculator import CalculatorError, CalculatorTool, evaluate
from roll.agentic.tools.wrapper import ToolEnvWrapper, ToolWrapperConfig
from roll.agentic.types import Env, EnvConfig, EnvError, Observation, RenderMode, StepResult

__all__ = ["CountdownConfig", "CountdownEnv", "CountdownProblem", "check_expression", "make_countdown"]

_ALLOWED_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div)


class CountdownConfig(EnvConfig):
    type: Literal["countdown"] = Field("countdown", description="selects this env (its roll.env entry point)")
    num_numbers: int = Field(default=4, ge=2, le=8, description="numbers given per problem")
    min_number: int = Field(default=1, ge=1, description="smallest given number")
    max_number: int = Field(default=50, ge=1, description="largest given number")
    max_target: int = Field(default=1000, ge=10, description="largest target a generated problem may have")
    max_steps: int = Field(default=3, ge=1, description="turns after which the episode is truncated")
    correct_reward: float = Field(1.0, description="reward of a valid expression equal to the target")
    wrong_answer_reward: float = Field(
        0.0, description="reward of any other submitted answer (ends the episode)"
    )
    format_error_reward: float = Field(
        default=0.0, le=0.0, description="reward of an output without an answer tag (the episode goes on)"
    )
    use_calculator: bool = Field(
        default=True, description="make_countdown wraps the env with a calculator tool"
    )
    tools: ToolWrapperConfig = Field(
        ToolWrapperConfig(), description="limits and rewards of the calculator tool wrapper (use_calculator)"
    )
    seed: int | None = Field(default=None, description="seeds the env's RNG for reset(seed=None)")

    @model_validator(mode="after")
    def _range_ok(self) -> CountdownConfig:
        if self.min_number > self.max_number:
            raise ValueError(f"min_number ({self.min_number}) is larger than max_number ({self.max_number})")
        return self


@dataclass(frozen=True)
class CountdownProblem:
    numbers: list[int]
    target: int
    solution: str


def generate_problem(config: CountdownConfig, rng: random.Random) -> CountdownProblem:
    """Numbers and a target reachable from them; retries until the target is in ``[1, max_target]``."""
    for _ in range(10_000):
        numbers = [rng.randint(config.min_number, config.max_number) for _ in range(config.num_numbers)]
        order = rng.sample(numbers, rng.randint(2, len(numbers)))
        value, expr = order[0], str(order[0])
        for b in order[1:]:
            ops = ["+", "*"] + (["-"] if value > b else []) + (["/"] if value % b == 0 else [])
            op = rng.choice(ops)
            value = {"+": value + b, "-": value - b, "*": value * b, "/": value // b}[op]
            expr = f"({expr} {op} {b})"
        if 1 <= value <= config.max_target:
            return CountdownProblem(numbers, value, expr[1:-1] if expr.startswith("(") else expr)
    raise EnvError(f"no countdown target <= {config.max_target} found; raise max_target or lower max_number")


def check_expression(expression: str, numbers: list[int], target: int) -> tuple[bool, str]:
    """Whether ``expression`` is a valid solution, and why not."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return False, "not an arithmetic expression"
    used: list[int] = []
    for node in ast.walk(tree.body):
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, int) or isinstance(node.value, bool):
                return False, f"{node.value!r} is not one of the numbers"
            used.append(node.value)
        elif isinstance(node, ast.BinOp) and not isinstance(node.op, _ALLOWED_OPS):
            return False, "only + - * / and parentheses are allowed"
        elif not isinstance(node, ast.BinOp | ast.operator):
            return False, "only numbers, + - * / and parentheses are allowed"
    extra = Counter(used) - Counter(numbers)
    if extra:
        return False, f"uses numbers not available (or more often than given): {sorted(extra.elements())}"
    try:
        value = evaluate(expression)
    except CalculatorError as exc:
        return False, str(exc)
    if value != Fraction(target):
        return False, f"evaluates to {float(value):g}, not {target}"
    return True, "correct"


class CountdownEnv:
    """The countdown :class:`~roll.agentic.types.Env` (without tools; see :func:`make_countdown`)."""

    def __init__(self, config: CountdownConfig | None = None) -> None:
        self.config = config or CountdownConfig()
        self.max_steps = self.config.max_steps
        self._rng = random.Random(self.config.seed)
        self.problem: CountdownProblem | None = None
        self._steps = 0
        self._done = True

    @property
    def system_prompt(self) -> str:
        return (
            "You solve arithmetic puzzles: combine the given numbers with + - * / and parentheses to reach the "
            "target. Use each number at most once. Think step by step, then give the final expression, for "
            "example <answer>(25 - 5) * 3</answer>."
        )

    @property
    def action_space_text(self) -> str:
        return "Answer with an arithmetic expression inside <answer></answer>"

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        seed = self._rng.getrandbits(63) if seed is None else seed
        self.problem = generate_problem(self.config, random.Random(seed))
        self._steps, self._done = 0, False
        info = {"seed": seed, "numbers": self.problem.numbers, "target": self.problem.target}
        return self.render(), info | {"solution": self.problem.solution}

    def step(self, action: str) -> StepResult:
        if self._done or self.problem is None:
            raise EnvError("step() called on a finished episode (or before reset()); call reset() first")
        self._steps += 1
        answer, _ = parse_action(action, valid_actions=None)
        if answer is None:
            truncated = self._steps >= self.max_steps
            self._done = truncated
            obs = "No answer found. Give the final expression inside <answer></answer> tags."
            return StepResult(obs, self.config.format_error_reward, False, truncated, {"format_ok": False})
        correct, reason = check_expression(answer, self.problem.numbers, self.problem.target)
        self._done = True
        reward = self.config.correct_reward if correct else self.config.wrong_answer_reward
        info = {"format_ok": True, "success": correct, "reason": reason}
        return StepResult(f"Your answer {answer} is {reason}.", reward, True, False, info)

    def render(self, mode: RenderMode = "text") -> str:
        if mode != "text":
            raise EnvError(f"countdown renders only as 'text', not {mode!r}")
        if self.problem is None:
            raise EnvError("render() called before reset()")
        return f"Using the numbers {self.problem.numbers}, create an expression that equals {self.problem.target}."

    def close(self) -> None:
        return None


def make_countdown(config: CountdownConfig | None = None) -> Env:
    """The countdown env, with a calculator tool when ``config.use_calculator``."""
    config = config or CountdownConfig()
    env = CountdownEnv(config)
    if not config.use_calculator:
        return env
    return ToolEnvWrapper(env, [CalculatorTool()], config.tools)
