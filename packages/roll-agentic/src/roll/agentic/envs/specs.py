"""The :class:`~roll.core.types.EnvSpec` objects that roll-agentic registers in the ``roll.env`` group.

The lead wires them as entry points: ``sokoban``, ``frozen_lake``, ``countdown``, ``guess_direction``, ``terminal``. Each
``build(config=None)`` returns a fresh :class:`~roll.agentic.types.Env`; the env modules are pure Python.
"""

from __future__ import annotations

from roll.agentic.envs.countdown import CountdownConfig, make_countdown
from roll.agentic.envs.frozen_lake import FrozenLakeConfig, FrozenLakeEnv
from roll.agentic.envs.learnable import GuessDirectionConfig, GuessDirectionEnv
from roll.agentic.envs.sokoban import SokobanConfig, SokobanEnv
from roll.agentic.envs.terminal import TerminalConfig, TerminalEnv
from roll.agentic.types import Env
from roll.core.types import EnvSpec

__all__ = ["ALL", "COUNTDOWN", "FROZEN_LAKE", "GUESS_DIRECTION", "SOKOBAN", "TERMINAL"]


def _sokoban(config: SokobanConfig | None = None) -> Env:
    return SokobanEnv(config)


def _frozen_lake(config: FrozenLakeConfig | None = None) -> Env:
    return FrozenLakeEnv(config)


def _terminal(config: TerminalConfig | None = None) -> Env:
    return TerminalEnv(config)


def _guess_direction(config: GuessDirectionConfig | None = None) -> Env:
    return GuessDirectionEnv(config)


SOKOBAN = EnvSpec(
    name="sokoban",
    build=_sokoban,
    config_model=SokobanConfig,
    description="push boxes onto targets; generated levels are solvable",
)
FROZEN_LAKE = EnvSpec(
    name="frozen_lake",
    build=_frozen_lake,
    config_model=FrozenLakeConfig,
    description="reach the goal without falling into a hole; optional slippery ice",
)
COUNTDOWN = EnvSpec(
    name="countdown",
    build=make_countdown,
    config_model=CountdownConfig,
    description="reach a target from numbers with + - * /; a calculator tool is available",
)
GUESS_DIRECTION = EnvSpec(
    name="guess_direction",
    build=_guess_direction,
    config_model=GuessDirectionConfig,
    description="a contextual bandit a ~1M-parameter model learns from scratch on CPU",
)

TERMINAL = EnvSpec(
    name="terminal",
    build=_terminal,
    config_model=TerminalConfig,
    description="bash commands in a private jailed scratch dir; a checker judges the final files",
)

ALL: dict[str, EnvSpec] = {
    spec.name: spec for spec in (SOKOBAN, FROZEN_LAKE, COUNTDOWN, GUESS_DIRECTION, TERMINAL)
}
