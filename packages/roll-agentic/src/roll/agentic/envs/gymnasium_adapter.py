"""A gymnasium environment (extra ``roll-agentic[gymnasium]``) as a text :class:`~roll.agentic.types.Env`.

Observations become text by, in order: a user ``render`` function (``module:name`` or ``file.py:name``, called as
``render(observation, info, env) -> str``); the observation itself when it is a string; ``env.render()`` when the
env was made with ``env_kwargs: {render_mode: ansi}`` (FrozenLake, Taxi, CliffWalking...), with terminal colours turned into
text (a highlighted cell, such as FrozenLake's player, becomes ``[S]``); else ``str(observation)``.

Actions come from the model's text by a user ``parse`` function (``parse(text, env) -> action | None``), else, for
a ``Discrete`` action space, by name: ``action_names`` (``[Left, Down, Right, Up]`` for FrozenLake) map to
``start, start + 1, ...``; the env then advertises ``Valid actions: Left, Down, Right, Up`` and roll's env manager
parses the ``<answer>`` tag. Without names a Discrete space takes the integer in the text. A text that parses to
no valid action does not step the env: the turn returns the same observation, reward ``invalid_action_reward``
and ``info["format_ok"] = False`` (roll's format penalty applies).

Faithful mapping: ``reset(seed)`` calls ``env.reset(seed=seed)`` (gymnasium seeds the env's own RNG, and
``seed=None`` continues it) and returns its info; a step returns gymnasium's reward, ``terminated``,
``truncated`` (also true once roll's ``max_steps`` is reached) and info unchanged, adding
``info["success"] = terminated and reward >= success_reward`` when the env does not set ``success``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, field_validator

from roll.agentic.types import EnvConfig, EnvError, Frame, Observation, RenderMode, StepResult
from roll.core.callables import resolve_callable
from roll.core.errors import PluginError

_INT = re.compile(r"-?\d+")
_HIGHLIGHT = re.compile(r"\x1b\[[0-9;]*m(.*?)\x1b\[0m")
_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def ansi_to_text(frame: str) -> str:
    """A terminal frame as plain text: highlighted spans in brackets, other escape codes dropped."""
    return _ESCAPE.sub("", _HIGHLIGHT.sub(r"[\1]", frame)).strip("\n")


class GymnasiumEnvConfig(EnvConfig):
    """A gymnasium env by id, with the text layer the module docstring describes."""

    type: Literal["gymnasium"] = Field("gymnasium", description="selects this env (its roll.env entry point)")
    env_id: str = Field(min_length=1, description="gymnasium id, e.g. FrozenLake-v1")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="gymnasium.make keyword arguments")
    render: str | None = Field(None, description="module:name of render(observation, info, env) -> str")
    parse: str | None = Field(None, description="module:name of parse(text, env) -> action or None")
    action_names: list[str] | None = Field(
        None, min_length=2, description="names of Discrete actions, in order"
    )
    system_prompt: str = Field(
        "You act in an environment. Read the observation and choose the next action.",
        description="the system message of every episode",
    )
    invalid_action_reward: float = Field(
        0.0, description="reward of a turn with no valid action (the env does not step)"
    )
    success_reward: float = Field(
        1.0, description="a terminating step with at least this reward is a success"
    )
    max_steps: int = Field(default=100, ge=1, description="steps after which the episode is truncated")

    @field_validator("render", "parse")
    @classmethod
    def _resolves(cls, value: str | None) -> str | None:
        if value is not None:
            resolve_callable(value)  # ValueError names the problem; the loader adds the key path
        return value


def import_gymnasium() -> Any:
    try:
        import gymnasium
    except ImportError as exc:
        raise PluginError(
            f"env 'gymnasium' needs the gymnasium package ({exc}): pip install 'roll-agentic[gymnasium]'"
        ) from exc
    return gymnasium


class GymnasiumEnv:
    """Adapter around one ``gymnasium.make(env_id)`` instance (see the module docstring)."""

    def __init__(self, config: GymnasiumEnvConfig) -> None:
        self.config = config
        self.max_steps = config.max_steps
        gymnasium = import_gymnasium()
        try:
            self.env = gymnasium.make(config.env_id, **config.env_kwargs)
        except gymnasium.error.Error as exc:
            raise EnvError(f"gymnasium.make({config.env_id!r}) failed: {exc}") from exc
        self._render_fn: Callable[..., Any] | None = (
            resolve_callable(config.render) if config.render else None
        )
        self._parse_fn: Callable[..., Any] | None = resolve_callable(config.parse) if config.parse else None
        self._check_action_names(gymnasium)
        self._steps, self._done, self._observation = 0, True, ""

    def _check_action_names(self, gymnasium: Any) -> None:
        space = self.env.action_space
        discrete = isinstance(space, gymnasium.spaces.Discrete)
        if self._parse_fn is None and not discrete:
            raise EnvError(
                f"{self.config.env_id} has a {type(space).__name__} action space: set `parse:` to a function "
                "that turns the model's text into an action"
            )
        names = self.config.action_names
        if names is not None and (not discrete or len(names) != int(space.n)):
            raise EnvError(f"action_names has {len(names)} names for the action space {space}")

    @property
    def system_prompt(self) -> str:
        """The configured prompt, then the valid actions and the answer format when actions are named."""
        names = self.config.action_names
        if not names or self._parse_fn is not None:
            return self.config.system_prompt
        example = f"<answer>{names[0]}</answer>"
        return (
            f"{self.config.system_prompt}\n{self.action_space_text}. Answer with one action, e.g. {example}."
        )

    @property
    def action_space_text(self) -> str:
        if self.config.action_names and self._parse_fn is None:
            return "Valid actions: " + ", ".join(self.config.action_names)
        return f"Action space: {self.env.action_space}"

    def text_of(self, observation: Any, info: dict[str, Any]) -> str:
        """The observation as text (the order of the module docstring)."""
        if self._render_fn is not None:
            return str(self._render_fn(observation, info, self.env))
        if isinstance(observation, str):
            return observation
        if getattr(self.env, "render_mode", None) == "ansi":
            return ansi_to_text(str(self.env.render()))
        return str(observation)

    def action_of(self, text: str) -> Any | None:
        """The env action the model's ``text`` names, or None when it names none."""
        if self._parse_fn is not None:
            return self._parse_fn(text, self.env)
        space = self.env.action_space
        start = int(space.start)
        names = self.config.action_names
        if names is not None:
            folded = [n.casefold() for n in names]
            key = text.strip().strip(".").casefold()
            return start + folded.index(key) if key in folded else None
        found = _INT.findall(text)
        value = int(found[-1]) if found else None
        return value if value is not None and space.contains(value) else None

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed)
        self._steps, self._done = 0, False
        self._observation = self.text_of(observation, dict(info))
        return self._observation, dict(info)

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError(f"step() on a finished {self.config.env_id} episode; call reset()")
        self._steps += 1
        cut = self._steps >= self.max_steps
        chosen = self.action_of(action)
        if chosen is None:
            self._done = cut
            info = {"format_ok": False, "invalid_action": True, "success": False}
            return StepResult(self._observation, self.config.invalid_action_reward, False, cut, info)
        observation, reward, terminated, truncated, info = self.env.step(chosen)
        truncated = bool(truncated) or (not terminated and cut)
        info = dict(info)
        info.setdefault("success", bool(terminated) and float(reward) >= self.config.success_reward)
        self._done = bool(terminated) or truncated
        self._observation = self.text_of(observation, info)
        return StepResult(self._observation, float(reward), bool(terminated), truncated, info)

    def render(self, mode: RenderMode = "text") -> Frame:
        if mode == "text":
            return self._observation
        raise EnvError("the gymnasium adapter renders text only; use the env's own render_mode for pictures")

    def close(self) -> None:
        self.env.close()
