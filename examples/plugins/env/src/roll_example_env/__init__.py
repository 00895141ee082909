"""``higher_lower``: guess a secret number from 1 to ``max_number``; after each wrong guess the game says "higher"
or "lower". Reward 1 for the turn that finds it, ``wrong_guess_reward`` for every other; ``max_steps`` guesses.

A guess is one of the action words ``1`` ... ``max_number``: the env manager takes it from the model's
``<answer>...</answer>`` (or the last such word of its output). When the output holds no valid word, the env gets
the model's raw text: that is a wrong guess (``format_ok`` false in ``info``), never an exception, since a bad move is
the policy's mistake, not the env's. ``info["expert_action"]`` is the binary-search guess, which a warm-up can
imitate.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import Field, model_validator

from roll.agentic.types import EnvConfig, EnvError, StepResult
from roll.core.types import EnvSpec


class HigherLowerConfig(EnvConfig):
    """The options of ``type: higher_lower``: an :class:`EnvConfig` (it brings ``max_steps``), strict."""

    type: Literal["higher_lower"] = "higher_lower"
    max_number: int = Field(8, ge=2, le=100, description="the secret is drawn from 1..max_number")
    wrong_guess_reward: float = Field(0.0, le=0.0, description="reward of a wrong guess (a penalty)")
    max_steps: int = Field(4, ge=1, description="guesses per episode")

    @model_validator(mode="after")
    def _enough_guesses(self) -> HigherLowerConfig:
        if 2**self.max_steps < self.max_number + 1:
            raise ValueError(
                f"max_steps={self.max_steps} guesses cannot always find a number in 1..{self.max_number}: "
                f"binary search needs {self.max_number.bit_length()}; raise max_steps or lower max_number"
            )
        return self


class HigherLowerEnv:
    """roll.agentic.types.Env: one instance per env slot, owned by one env manager (no thread safety needed)."""

    def __init__(self, config: HigherLowerConfig) -> None:
        self.config = config
        self.max_steps = config.max_steps
        self.low, self.high, self.secret, self.turn, self.done = 1, config.max_number, 1, 0, True

    @property
    def system_prompt(self) -> str:
        return (
            f"I am thinking of a number from 1 to {self.config.max_number}. Guess it; after each wrong guess I say "
            f"higher or lower. {self.action_space_text}. Answer like <answer>3</answer>."
        )

    @property
    def action_space_text(self) -> str:
        return "Valid actions: " + ", ".join(str(n) for n in range(1, self.config.max_number + 1))

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        rng = random.Random(seed)  # the same seed, the same secret: a GRPO group shares one
        self.secret = rng.randint(1, self.config.max_number)
        self.low, self.high, self.turn, self.done = 1, self.config.max_number, 0, False
        return "Your first guess?", {"expert_action": self._expert()}

    def step(self, action: str) -> StepResult:
        if self.done:
            raise EnvError("the episode is over: call reset")
        self.turn += 1
        guess = _number(action, self.config.max_number)
        if guess == self.secret:
            self.done = True
            return StepResult(f"{guess} is right!", 1.0, True, False, {"success": True})
        if guess is None:
            text = f"That is not a number from 1 to {self.config.max_number}."
        elif guess < self.secret:
            self.low, text = max(self.low, guess + 1), f"{guess}: higher."
        else:
            self.high, text = min(self.high, guess - 1), f"{guess}: lower."
        truncated = self.turn >= self.max_steps
        self.done = truncated
        info: dict[str, Any] = {"success": False, "format_ok": guess is not None}
        if not truncated:
            info["expert_action"] = self._expert()
        return StepResult(text, self.config.wrong_guess_reward, False, truncated, info)

    def render(self, mode: str = "text") -> str:
        if mode != "text":
            raise EnvError(f"higher_lower renders only as 'text', not {mode!r}")
        return f"The secret is between {self.low} and {self.high}."

    def close(self) -> None:
        return None

    def _expert(self) -> str:
        return str((self.low + self.high) // 2)


def _number(action: str, max_number: int) -> int | None:
    """The guess in ``action``, or None when it is not a whole number from 1 to ``max_number``."""
    text = action.strip()
    return int(text) if text.isdecimal() and 1 <= int(text) <= max_number else None


def build(config: HigherLowerConfig | None) -> HigherLowerEnv:
    """roll.core.types.EnvBuild: called once per env slot, inside an env worker (a Ray actor)."""
    return HigherLowerEnv(config or HigherLowerConfig())


SPEC = EnvSpec(
    name="higher_lower",
    build=build,
    config_model=HigherLowerConfig,
    description="guess a number from 1 to max_number with higher/lower hints",
)
