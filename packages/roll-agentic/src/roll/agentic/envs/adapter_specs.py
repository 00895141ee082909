"""``roll.env`` specs of the adapters to other env suites: ``gem`` and ``gymnasium`` (optional extras).

Light: the adapter modules import their library only when an env is built, so ``roll list`` works without them
and a missing extra is reported with the ``pip install`` that brings it.
"""

from __future__ import annotations

from roll.agentic.envs.gem_adapter import GemEnv, GemEnvConfig
from roll.agentic.envs.gymnasium_adapter import GymnasiumEnv, GymnasiumEnvConfig
from roll.agentic.types import Env
from roll.core.types import EnvSpec

__all__ = ["GEM", "GYMNASIUM"]


def _gem(config: GemEnvConfig) -> Env:
    return GemEnv(config)


def _gymnasium(config: GymnasiumEnvConfig) -> Env:
    return GymnasiumEnv(config)


GEM = EnvSpec(
    name="gem",
    build=_gem,
    config_model=GemEnvConfig,
    description="any GEM env by id (game:, math:, qa:, rg: ...), optionally with GEM's python tool",
)
GYMNASIUM = EnvSpec(
    name="gymnasium",
    build=_gymnasium,
    config_model=GymnasiumEnvConfig,
    description="a gymnasium env with a text observation or a user render/parse pair",
)
