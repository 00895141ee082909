"""How rollouts sample: the settings every RL mode shares, under one key path (``rollout.*``).

rlvr names them ``rollout.max_new_tokens``, ``rollout.temperature``, ``rollout.top_p``; every other RL mode
(agentic, agentic_rollout, agent_gateway, rlvr_rollout) uses the same paths, so a setting moves between modes as
it is. A mode's ``rollout`` section subclasses :class:`SamplingConfig` to add its own scheduling keys or to change
a default (the agent gateway answers 64 tokens, evaluation is greedy). Light: pydantic only.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from roll.core.config.base import RollModel

__all__ = ["SAMPLING_KEYS", "SamplingConfig", "moved_sampling_keys", "upgrade_sampling"]

SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p")
"""The keys of :class:`SamplingConfig`, which some modes once kept in a section of their own."""


class SamplingConfig(RollModel):
    """The sampling of one generation (a turn, an agent's call, an answer): length, temperature, nucleus."""

    max_new_tokens: int = Field(32, ge=1, description="tokens the model may generate per response (or turn)")
    temperature: float = Field(1.0, ge=0.0, description="sampling temperature; 0 is greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass; 1 disables it")


def moved_sampling_keys(section: str) -> dict[str, str]:
    """``{"<section>.max_new_tokens": "rollout.max_new_tokens", ...}``: a mode's ``moved_keys`` entries for the
    sampling keys it once kept in ``section`` (``env_manager``, ``gateway``)."""
    return {f"{section}.{key}": f"rollout.{key}" for key in SAMPLING_KEYS}


def upgrade_sampling(data: dict[str, Any], section: str) -> dict[str, Any]:
    """``data`` (a saved config, see :meth:`~roll.core.config.sections.RunConfig.upgrade_saved`) with the sampling
    keys of ``section`` moved under ``rollout``; a key ``rollout`` already holds is kept."""
    old = data.get(section)
    if not isinstance(old, dict):
        return data
    old = dict(old)
    moved = {key: old.pop(key) for key in SAMPLING_KEYS if key in old}
    return {**data, section: old, "rollout": {**moved, **dict(data.get("rollout") or {})}}
