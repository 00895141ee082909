"""Guess-the-direction: a toy env that a ~1M-parameter model can learn from scratch with RL on a CPU.

Each round the observation names where the goal is ("The goal is to the left.") and the policy answers with the
matching action word (Left, Right, Up, Down). A correct answer earns 1, anything else 0; the episode terminates
after ``max_steps`` rounds (1 by default), each with a fresh direction drawn from the episode's seed.

Why it is learnable quickly, by design:

- it is a contextual bandit: the reward is immediate and depends on one observation word, so there is no credit
  assignment across turns and every sampled answer gets an informative reward;
- a random policy over the valid words already succeeds 1/``num_directions`` of the time (1/2 with two
  directions), so the advantage signal is dense from the first step instead of waiting for a lucky success;
- the optimal policy is a fixed 4-way lookup from one prompt token to one answer word, which a tiny model can
  represent, and prompts are ~15 tokens, so a batch of 64 episodes is a few thousand tokens (under a second of
  compute at ~10k tokens/s for a 1M model).

A tabular softmax policy trained with REINFORCE goes from ~25% to >90% success in 50 steps of 16 episodes
(``tests/agentic/test_learnable.py``); a tiny language model additionally has to learn to emit an action word,
which ``parse_action``'s format reward teaches.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import Field

from roll.agentic.types import EXPERT_ACTION, EnvConfig, EnvError, Observation, RenderMode, StepResult

__all__ = ["PHRASES", "GuessDirectionConfig", "GuessDirectionEnv"]

PHRASES: dict[str, str] = {
    "Left": "The goal is to the left.",
    "Right": "The goal is to the right.",
    "Up": "The goal is up.",
    "Down": "The goal is down.",
}


class GuessDirectionConfig(EnvConfig):
    type: Literal["guess_direction"] = Field(
        "guess_direction", description="selects this env (its roll.env entry point)"
    )
    num_directions: Literal[2, 4] = Field(default=4, description="2: Left/Right only; 4: all four")
    max_steps: int = Field(default=1, ge=1, le=10, description="rounds per episode")
    correct_reward: float = Field(1.0, description="reward of a correct guess")
    seed: int | None = Field(default=None, description="seeds the env's RNG for reset(seed=None)")


class GuessDirectionEnv:
    """The guess-the-direction :class:`~roll.agentic.types.Env`."""

    def __init__(self, config: GuessDirectionConfig | None = None) -> None:
        self.config = config or GuessDirectionConfig()
        self.max_steps = self.config.max_steps
        self.actions = list(PHRASES)[: self.config.num_directions]
        self._rng = random.Random(self.config.seed)
        self._round_rng = random.Random(0)
        self.direction: str | None = None
        self._steps = 0
        self._done = True

    @property
    def system_prompt(self) -> str:
        return f"Move toward the goal. {self.action_space_text}. Answer like <answer>Left</answer>."

    @property
    def action_space_text(self) -> str:
        return "Valid actions: " + ", ".join(self.actions)

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        seed = self._rng.getrandbits(63) if seed is None else seed
        self._round_rng = random.Random(seed)
        self.direction = self._round_rng.choice(self.actions)
        self._steps, self._done = 0, False
        return self.render(), {"seed": seed, "direction": self.direction, EXPERT_ACTION: self.direction}

    def step(self, action: str) -> StepResult:
        if self._done or self.direction is None:
            raise EnvError("step() called on a finished episode (or before reset()); call reset() first")
        self._steps += 1
        name = action.strip().capitalize()
        correct = name == self.direction
        info = {"action_is_valid": name in self.actions, "success": correct, "direction": self.direction}
        terminated = self._steps >= self.max_steps
        self._done = terminated
        if terminated:
            obs = "Correct!" if correct else f"Wrong, the goal was {self.direction}."
        else:
            self.direction = self._round_rng.choice(self.actions)
            obs = ("Correct! " if correct else "Wrong. ") + self.render()
            info[EXPERT_ACTION] = self.direction
        return StepResult(obs, self.config.correct_reward if correct else 0.0, terminated, False, info)

    def render(self, mode: RenderMode = "text") -> str:
        if mode != "text":
            raise EnvError(f"guess_direction renders only as 'text', not {mode!r}")
        if self.direction is None:
            raise EnvError("render() called before reset()")
        return PHRASES[self.direction]

    def close(self) -> None:
        return None
