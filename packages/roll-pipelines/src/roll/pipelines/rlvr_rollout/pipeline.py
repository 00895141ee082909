"""The ``rlvr_rollout`` run: load prompts, start the inference and reward workers, generate, score, write.

One "step": every prompt (up to ``max_prompts``) is answered ``batch.samples_per_prompt`` times through the
:class:`~roll.core.scheduler.GenerateScheduler` (request by request over the inference ranks), the answers are
scored by the :class:`~roll.core.scheduler.RewardScheduler` (reward workers by domain, as in ``rlvr``), and the run
writes ``samples.jsonl`` and ``summary.json`` (see :mod:`roll.pipelines.rlvr_rollout`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.config.sections import RoleConfig
from roll.core.run import RunHost
from roll.core.scheduler import GenerateOptions, GenerateScheduler, RankRequest
from roll.core.types import Phases
from roll.pipelines.common.data import load_tokenizer, prepare_data
from roll.pipelines.rlvr.config import reward_routes
from roll.pipelines.rlvr.data import CARRY_COLUMNS, prompt_batch
from roll.pipelines.rlvr.scoring import reward_roles, start_rewards
from roll.pipelines.rlvr_rollout import RolloutEvalConfig
from roll.pipelines.rlvr_rollout.metrics import domain_table, summarize
from roll.workers.config import SamplingParams
from roll.workers.roles.infer import ActorInferWorker
from roll.workers.roles.spec import GeneratorSpec

if TYPE_CHECKING:
    from roll.workers.roles.clusters import ActorInferCluster

SAMPLES_FILE = "samples.jsonl"
SUMMARY_FILE = "summary.json"


def _no_feed(n: int) -> Batch:
    raise RuntimeError("rlvr_rollout generates with generate_all; it has no prompt feed")


class RolloutEvalRecipe:
    """See the module docstring."""

    def __init__(self, config: RolloutEvalConfig, host: RunHost) -> None:
        self.config = config
        self.host = host
        self.domain_of, self.route_default = reward_routes(dict(config.rewards))
        only = next(iter(config.rewards)) if len(config.rewards) == 1 else None
        self.default_domain = self.route_default or only  # where untagged rows go
        self.scheduler: GenerateScheduler | None = None

    def phases(self) -> Phases:
        return Phases(teardown=self.teardown)

    def roles(self) -> Mapping[str, RoleConfig]:
        roles: dict[str, RoleConfig] = {"actor_infer": self.config.actor_infer}
        roles.update(reward_roles(self.config.rewards))
        return roles

    def setup(self) -> None:
        cfg = self.config
        model = cfg.actor_infer.model
        tokenizer = load_tokenizer(model.tokenizer or model.path)
        data = prepare_data(cfg.data, cfg.tokenize, kind="prompt", tokenizer=tokenizer)
        self.rows = (data.train + data.eval)[: cfg.max_prompts]
        env = {"env_vars": {"OMP_NUM_THREADS": str(cfg.cpu_threads)}} if cfg.cpu_threads else None
        strategy = cfg.actor_infer.strategy
        self.infer = cast(
            "ActorInferCluster",
            self.host.make_cluster(
                "actor_infer",
                ActorInferWorker,
                init_args=(GeneratorSpec(model=model, strategy=strategy),),
                runtime_env=env,
            ),
        )
        self.rewards = start_rewards(self.host.make_cluster, cfg.rewards)
        self.infer.setup()
        options = GenerateOptions(
            group_size=cfg.batch.samples_per_prompt,
            request_prompts=cfg.rollout.request_prompts,
            carry_columns=CARRY_COLUMNS,
        )
        params = SamplingParams(
            n=cfg.batch.samples_per_prompt,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            max_new_tokens=cfg.rollout.max_new_tokens,
        )
        self.scheduler = GenerateScheduler(RankRequest.bind(self.infer.generate, params), _no_feed, options)

    def train_step(self, step: int) -> Mapping[str, float]:
        if self.scheduler is None:
            raise RuntimeError(
                "rlvr_rollout: train_step runs after setup() (the run calls them in that order)"
            )
        scored = self.rewards.score(self.scheduler.generate_all(prompt_batch(self.rows)))
        if (
            C.REWARD_ERROR_REPORT in scored.non_tensors
        ):  # a reward's first error of each kind, with its traceback
            self.host.failures.show(scored.non_tensors[C.REWARD_ERROR_REPORT])
        summary = self._summary(scored)
        self._write(scored, summary)
        return summary

    def _summary(self, scored: Batch) -> dict[str, float]:
        g = self.config.batch.samples_per_prompt

        def table(values: list[Any]) -> list[list[Any]]:
            return [values[i : i + g] for i in range(0, len(values), g)]

        correct = table([bool(v) for v in scored[C.CORRECT].tolist()])
        scores = table([float(v) for v in scored[C.SCORES].tolist()])
        lengths = table([len(ids) for ids in scored[C.RESPONSE_IDS]])
        tags = [str(t) for t in scored["tag"]][::g]
        domains = domain_table(tags, self.domain_of, self.default_domain)
        return summarize(correct, scores, lengths, domains, self.config.pass_k)

    def _write(self, scored: Batch, summary: Mapping[str, float]) -> None:
        self.host.output_dir.mkdir(parents=True, exist_ok=True)
        with (self.host.output_dir / SAMPLES_FILE).open("w", encoding="utf-8") as out:
            for i in range(len(scored)):
                row = {
                    "prompt_index": i // self.config.batch.samples_per_prompt,
                    "sample": i % self.config.batch.samples_per_prompt,
                    "prompt": str(scored["prompt"][i]),
                    "response": str(scored[C.TEXT][i]),
                    "ground_truth": str(scored["ground_truth"][i]),
                    "tag": str(scored["tag"][i]),
                    "score": float(scored[C.SCORES][i]),
                    "correct": bool(scored[C.CORRECT][i]),
                    "length": len(scored[C.RESPONSE_IDS][i]),
                    "finish_reason": str(scored[C.FINISH_REASON][i]),
                }
                out.write(json.dumps(row) + "\n")
        (self.host.output_dir / SUMMARY_FILE).write_text(
            json.dumps(dict(summary), indent=2, sort_keys=True) + "\n"
        )

    def save_files(self, directory: Path) -> None:
        """A rollout trains nothing: its checkpoints hold no model files."""

    def load_files(self, directory: Path) -> None:
        """Nothing to restore (see :meth:`save_files`)."""

    def state(self) -> Mapping[str, Any]:
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore: every step generates for all of ``rows``."""

    def teardown(self) -> None:
        """Stop the generate scheduler (before a restart after a lost worker, and at shutdown)."""
        if self.scheduler is not None:
            self.scheduler.close()
            self.scheduler = None
