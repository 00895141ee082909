"""Implementation of the ``agentic_rollout`` pipeline (see the package docstring)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from roll.agentic.env_manager.episode import Episode
from roll.agentic.pipeline.agentic_rollout import AgenticRolloutConfig
from roll.agentic.pipeline.runtime import RolloutRuntime, dump_jsonl
from roll.core.config.sections import RoleConfig
from roll.core.run import RunHost
from roll.core.types import Phases

SUMMARY_FILE = "success_rates.json"


class AgenticRolloutRecipe:
    """Plays ``batch.prompts_per_step`` groups of ``batch.samples_per_prompt`` envs per step with the policy
    ``actor_infer`` serves; trains nothing."""

    def __init__(self, config: AgenticRolloutConfig, host: RunHost) -> None:
        self.config = config
        self.host = host
        self.episodes: list[Episode] = []

    def phases(self) -> Phases:
        return Phases()

    def roles(self) -> Mapping[str, RoleConfig]:
        return {"actor_infer": self.config.actor_infer, "env_workers": self.config.env_workers}

    def setup(self) -> None:
        cfg = self.config
        self.runtime = RolloutRuntime(
            cfg, self.host.make_cluster, cfg.batch.prompts_per_step, cfg.batch.samples_per_prompt
        )
        self.runtime.setup()
        self.trajectories = self.host.output_dir / cfg.trajectories_file
        if self.host.step == 0 and self.trajectories.exists():
            self.trajectories.unlink()

    def train_step(self, step: int) -> Mapping[str, float]:
        rollout = self.runtime.rollout(
            batch_seed=self.config.seed * 1_000_003 + step, greedy=self.config.greedy
        )
        self.host.failures.show(rollout.errors)
        dump_jsonl(self.trajectories, rollout.started, step)
        self.episodes += rollout.episodes
        self._write_summary()
        return rollout.metrics()

    def _write_summary(self) -> None:
        by_tag: dict[str, list[Episode]] = {}
        for e in self.episodes:
            by_tag.setdefault(e.tag, []).append(e)
        summary: dict[str, Any] = {
            tag: {
                "episodes": len(eps),
                "success_rate": sum(e.success for e in eps) / len(eps),
                "return": sum(e.total_reward for e in eps) / len(eps),
            }
            for tag, eps in sorted(by_tag.items())
        }
        n = max(len(self.episodes), 1)
        summary["all"] = {
            "episodes": len(self.episodes),
            "success_rate": sum(e.success for e in self.episodes) / n,
        }
        (self.host.output_dir / SUMMARY_FILE).write_text(
            json.dumps(summary, indent=2) + "\n", encoding="utf-8"
        )

    def save_files(self, directory: Path) -> None:
        """A rollout trains nothing: its checkpoints hold no model files."""

    def load_files(self, directory: Path) -> None:
        """Nothing to restore (see :meth:`save_files`)."""

    def state(self) -> Mapping[str, Any]:
        return {"episodes": len(self.episodes)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore: the episode count is a record; ``success_rates.json`` covers this run's episodes."""
