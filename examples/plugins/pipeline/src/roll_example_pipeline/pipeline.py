"""The ``best_of_n`` run, composed from roll's shared parts (nothing copied from another mode):

- :class:`~roll.core.run.Run`, which holds this recipe: Ray, placement, the step loop, tracking, checkpoints, failures,
  shutdown; the recipe reaches them through its :class:`~roll.core.run.RunHost`;
- :class:`~roll.workers.roles.infer.ActorInferWorker`: the model role that generates (any infer strategy);
- :class:`~roll.pipelines.rlvr.reward_worker.RewardWorker`: one cluster per reward domain, any ``roll.reward`` plugin,
  started with the scheduler over them by :func:`~roll.pipelines.rlvr.scoring.start_rewards`;
- :class:`~roll.core.scheduler.GenerateScheduler` and :class:`~roll.core.scheduler.RewardScheduler`: n samples per
  prompt over the inference ranks, scores routed to the domains by tag, deadlines enforced;
- rlvr's data helpers (:func:`prepare_data`, :func:`prompt_batch`).

One step samples and scores every prompt; a run of ``max_steps`` steps resamples (each step is seeded apart).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.config.sections import RoleConfig
from roll.core.run import RunHost
from roll.core.scheduler import GenerateOptions, GenerateScheduler, RankRequest
from roll.core.types import Phases
from roll.pipelines.common.data import load_tokenizer, prepare_data
from roll.pipelines.rlvr.data import CARRY_COLUMNS, prompt_batch
from roll.pipelines.rlvr.scoring import reward_roles, start_rewards
from roll.workers.config import SamplingParams
from roll.workers.roles.infer import ActorInferWorker
from roll.workers.roles.spec import GeneratorSpec
from roll_example_pipeline import BestOfNConfig

if (
    TYPE_CHECKING
):  # the typed cluster handles import the worker classes (and torch): the driver names them only
    from roll.workers.roles.clusters import ActorInferCluster

OUTPUT_FILE = "best_of_n.jsonl"


class Kept(TypedDict):
    """One line of ``best_of_n.jsonl``: a prompt's best answer, its score and all ``n`` scores."""

    prompt: str
    response: str
    ground_truth: str
    score: float
    scores: list[float]


def _no_feed(n: int) -> Batch:
    raise RuntimeError("best_of_n generates with generate_all; it has no prompt feed")


class BestOfNRecipe:
    """A recipe (roll.core.types.Recipe): ``roles`` (what to place), ``setup`` (start the clusters),
    ``train_step`` (one step), what a checkpoint holds, and its optional phases (here only ``teardown``)."""

    def __init__(self, config: BestOfNConfig, host: RunHost) -> None:
        self.config = config
        self.host = host
        self.generator: GenerateScheduler | None = None

    def phases(self) -> Phases:
        return Phases(teardown=self.teardown)

    def roles(self) -> Mapping[str, RoleConfig]:
        roles: dict[str, RoleConfig] = {"actor_infer": self.config.actor_infer}
        roles.update(reward_roles(self.config.rewards))
        return roles

    def setup(self) -> None:
        cfg = self.config
        model, strategy = cfg.actor_infer.model, cfg.actor_infer.strategy
        tokenizer = load_tokenizer(model.tokenizer or model.path)
        data = prepare_data(cfg.data, cfg.tokenize, kind="prompt", tokenizer=tokenizer)
        self.rows = data.train
        env = {"env_vars": {"OMP_NUM_THREADS": str(cfg.cpu_threads)}} if cfg.cpu_threads else None
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
            group_size=cfg.n, request_prompts=cfg.request_prompts, carry_columns=CARRY_COLUMNS
        )
        params = SamplingParams(n=cfg.n, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)
        self.generator = GenerateScheduler(RankRequest.bind(self.infer.generate, params), _no_feed, options)

    def train_step(self, step: int) -> Mapping[str, float]:
        if self.generator is None:
            raise RuntimeError("best_of_n: train_step runs after setup() (the run calls them in that order)")
        scored = self.rewards.score(self.generator.generate_all(prompt_batch(self.rows)))
        if (
            C.REWARD_ERROR_REPORT in scored.non_tensors
        ):  # a reward's first error of each kind, with its traceback
            self.host.failures.show(scored.non_tensors[C.REWARD_ERROR_REPORT])
        kept = self._best(scored)
        self._write(kept)
        scores = [s for row in kept for s in row["scores"]]
        errors = scored[C.REWARD_ERROR].tolist()
        return {
            "best_of_n/best_score": sum(row["score"] for row in kept) / len(kept),
            "best_of_n/mean_score": sum(scores) / len(scores),
            "best_of_n/prompts": float(len(kept)),
            "reward/errors": sum(errors)
            / len(errors),  # the failure guard's error rate (failures.max_error_rate)
        }

    def _best(self, scored: Batch) -> list[Kept]:
        """One row per prompt: its best-scored answer (the first of equals) and all n scores."""
        n = self.config.n
        kept: list[Kept] = []
        scores = [float(s) for s in scored[C.SCORES].tolist()]
        for start in range(0, len(scored), n):
            group = scores[start : start + n]
            best = start + group.index(max(group))
            kept.append({
                "prompt": str(scored["prompt"][best]), "response": str(scored[C.TEXT][best]),
                "ground_truth": str(scored["ground_truth"][best]), "score": scores[best], "scores": group,
            })  # fmt: skip
        return kept

    def _write(self, kept: list[Kept]) -> None:
        self.host.output_dir.mkdir(parents=True, exist_ok=True)
        with (self.host.output_dir / OUTPUT_FILE).open("w", encoding="utf-8") as out:
            out.writelines(json.dumps(row) + "\n" for row in kept)

    def save_files(self, directory: Path) -> None:
        """Best-of-n trains nothing: its checkpoints hold no model files."""

    def load_files(self, directory: Path) -> None:
        """Nothing to restore (see :meth:`save_files`)."""

    def state(self) -> Mapping[str, Any]:
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore: every step samples all of ``rows``."""

    def teardown(self) -> None:
        """Stop the generate scheduler (before a restart after a lost worker, and at shutdown)."""
        if self.generator is not None:
            self.generator.close()
            self.generator = None
