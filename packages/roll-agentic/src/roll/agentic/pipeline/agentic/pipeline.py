"""The agentic pipeline: multi-turn RL on env workers. One step reads top to bottom::

    rollout -> samples -> advantages -> train -> sync_weights -> log      (checkpoint: BasePipeline's cadence)

- ``rollout``: the env manager plays ``P`` groups of ``G`` envs against ``actor_infer`` (one batched generate
  per turn); envs that hang are cut off and dropped; redundancy keeps the first groups to finish.
- ``samples``: trajectory-wise (one row per episode) or step-wise (one row per turn) token rows whose loss mask
  covers only model-sampled tokens.
- ``advantages``: reward normalization (batch/group/tag/running), then the preset's estimator over episode
  groups, or GiGPO in step mode (:func:`~roll.pipelines.algorithms.estimators.estimate_advantages`).
- ``train``: the shared :class:`~roll.pipelines.algorithms.losses.PolicyLoss` (TIS included) on ``actor_train``,
  one call per optimizer step.
- ``sync_weights``: :class:`~roll.workers.model_update.ModelUpdateGroup` pushes the weights, versioned.

Simplifications, on purpose: no reference model (KL) and no critic yet (the config says so when asked); the
rollout is synchronous (generation waits for training), which keeps on-policy samples exact.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from roll.agentic.env_manager.batching import to_batch
from roll.agentic.env_manager.episode import Sample
from roll.agentic.env_manager.manager import Rollout
from roll.agentic.env_manager.slots import ResetOutcome, ResetRequest
from roll.agentic.pipeline.agentic import AgenticConfig, GiGPOConfig
from roll.agentic.pipeline.runtime import AgenticActorWorker, RolloutRuntime, plot_success
from roll.agentic.types import EXPERT_ACTION
from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.config.sections import RoleConfig
from roll.core.errors import ConfigError
from roll.core.pipeline import BasePipeline
from roll.core.tracking import reduce_metrics
from roll.pipelines.algorithms.advantages import RunningMeanStd
from roll.pipelines.algorithms.estimators import (
    AdvantageInputs,
    EstimatorParams,
    estimate_advantages,
    normalize_rewards,
)
from roll.pipelines.algorithms.losses import MaskedNLLLoss, PolicyLoss
from roll.workers.model_update import ModelUpdateGroup

logger = logging.getLogger(__name__)
ACTOR_FILES = "actor"
TRAIN_COLUMNS = (C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK, C.INFER_LOGP, C.ADVANTAGES, C.OLD_LOGP)
EVAL_SEED_BASE = 1_000_000_007


class AgenticPipeline(BasePipeline):
    """See the module docstring."""

    config: AgenticConfig

    def __init__(self, config: AgenticConfig) -> None:
        super().__init__(config, name="agentic")
        self.running = RunningMeanStd() if config.reward_norm_mode == "running" else None

    def roles(self) -> Mapping[str, RoleConfig]:
        cfg = self.config
        return {
            "actor_train": cfg.actor_train,
            "actor_infer": cfg.actor_infer,
            "env_workers": cfg.env_workers,
        }

    def setup(self) -> None:
        cfg = self.config
        b = cfg.batch
        self.runtime = RolloutRuntime(cfg, self.make_cluster, b.prompts_per_step, b.samples_per_prompt)
        env = {"env_vars": {"OMP_NUM_THREADS": str(cfg.cpu_threads)}} if cfg.cpu_threads else None
        train_cfg = cfg.train.model_copy(
            update={
                "micro_batch_size": b.micro_batch_samples,
                "max_tokens_per_micro_batch": b.micro_batch_tokens,
            }
        )
        total = cfg.max_steps * b.optimizer_steps_per_step + (cfg.warmup.steps if cfg.warmup else 0)
        self.actor = self.make_cluster(
            "actor_train", AgenticActorWorker, init_args=(cfg.model, train_cfg, total, cfg.train_strategy),
            init_kwargs={"threads": cfg.cpu_threads}, runtime_env=env,
        )  # fmt: skip
        pending = [self.actor.setup.submit(), self.runtime.infer.setup.submit()]
        for call in pending:
            call.result()
        self.updater = ModelUpdateGroup(self.actor, self.runtime.infer, bucket_mb=cfg.bucket_mb)

    # ------------------------------------------------------------------------------------------- the step

    def train_step(self, step: int) -> Mapping[str, float]:
        if step == 0 and self.config.warmup is not None and self.updater.version == 0:
            self.warmup()
        timings: dict[str, float] = {}
        rollout = _timed(timings, "rollout", lambda: self.rollout(step))
        samples = rollout.samples(self.config.env_manager.mode, self.config.env_manager.gamma)
        metrics = rollout.metrics()
        if samples:
            batch = _timed(timings, "advantages", lambda: self.advantages(samples))
            metrics.update(_timed(timings, "train", lambda: self.train(batch, step)))
            _timed(timings, "sync", self.sync_weights)
        else:
            logger.warning("step %d: every episode was dropped; nothing to train on", step)
        return self.log(metrics, samples, timings)

    def rollout(self, step: int) -> Rollout:
        return self.runtime.rollout(batch_seed=self.config.seed * 1_000_003 + step)

    def advantages(self, samples: list[Sample]) -> Batch:
        """Padded rows with ``advantages_BT`` and, for several optimizer steps per rollout, ``old_logp_BT``."""
        cfg = self.config
        batch = to_batch(samples, self.runtime.encoder.pad_token_id)
        t, gigpo = batch.tensors, cfg.gigpo or GiGPOConfig()
        rewards_B = normalize_rewards(
            t[C.SCORES].float(), mode=cfg.reward_norm_mode, group_ids_B=t[C.GROUP_ID],
            tags=list(batch[C.TAG]), running=self.running,
        )  # fmt: skip
        inputs = AdvantageInputs(
            rewards_B, t[C.RESPONSE_MASK].float(), group_ids_B=t[C.GROUP_ID],
            step_returns_B=t.get(C.STEP_RETURN), anchor_ids_B=t.get(C.ANCHOR_ID),
        )  # fmt: skip
        params = EstimatorParams.of(
            cfg.algorithm, step_weight=gigpo.step_weight, norm_by_std=gigpo.norm_by_std
        )
        batch[C.ADVANTAGES] = estimate_advantages(cfg.estimator, inputs, params).advantages_BT
        if self._use_old_logp():
            seqs = Batch({k: batch.tensors[k] for k in (C.INPUT_IDS, C.ATTENTION_MASK)})
            batch[C.OLD_LOGP] = self.actor.compute_logprobs(seqs)[C.LOGP] * batch.tensors[C.RESPONSE_MASK]
        return batch

    def train(self, batch: Batch, step: int) -> dict[str, float]:
        """One ``train_step`` call per optimizer step (a seeded shuffle, near-equal parts)."""
        cfg = self.config
        loss = PolicyLoss(
            cfg.algorithm, norm_len=cfg.env_manager.max_new_tokens, use_old_logp=self._use_old_logp()
        )
        view = Batch({k: batch.tensors[k] for k in TRAIN_COLUMNS if k in batch})
        order = torch.randperm(len(view), generator=torch.Generator().manual_seed(cfg.seed + step))
        parts = min(cfg.batch.optimizer_steps_per_step, len(view))
        sizes = [len(view) // parts + (i < len(view) % parts) for i in range(parts)]
        per_rank: list[dict[str, float]] = []
        for part in view.select(order).split(sizes):
            per_rank += self.actor.train_step(part, loss, cfg.env_manager.temperature or 1.0)
        return reduce_metrics(per_rank, how={"tokens": "sum"})

    def sync_weights(self) -> None:
        self.updater.sync()

    def log(
        self, metrics: dict[str, float], samples: list[Sample], timings: Mapping[str, float]
    ) -> dict[str, float]:
        out = {k if "/" in k else f"actor/{k}": v for k, v in metrics.items()}
        out["samples"] = float(len(samples))
        out["tokens/trained"] = float(sum(sum(s.loss_mask) for s in samples))
        out.update({f"time/{k}_s": v for k, v in timings.items()})
        out["policy_version"] = float(self.updater.version)
        return out

    def _use_old_logp(self) -> bool:
        return self.config.batch.optimizer_steps_per_step > 1

    # ------------------------------------------------------------------------------------------- warm-up

    def warmup(self) -> None:
        """SFT on env prompts answered with uniformly random valid actions: the format, not the task."""
        wu = self.config.warmup
        if wu is None:
            return
        lr = self.config.train.optimizer.lr
        if wu.lr is not None:
            self.actor.set_lr(wu.lr)
        rng, loss = random.Random(self.config.seed), MaskedNLLLoss("response")
        metrics: dict[str, float] = {}
        for i in range(wu.steps):
            samples = self._warmup_samples(rng, wu.batch_size, wu.answer_template, wu.expert_fraction)
            batch = to_batch(samples, self.runtime.encoder.pad_token_id)
            view = Batch({k: batch.tensors[k] for k in (C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK)})
            metrics = reduce_metrics(self.actor.train_step(view, loss))
            self.tracker.log({f"warmup/{k}": v for k, v in metrics.items()}, i - wu.steps)
        self.actor.set_lr(lr)
        self.sync_weights()
        logger.info("warm-up: %d steps, last nll %.3f", wu.steps, metrics.get("actor/nll", float("nan")))

    def _warmup_samples(
        self, rng: random.Random, count: int, template: str, expert_fraction: float = 0.0
    ) -> list[Sample]:
        enc, pool = self.runtime.encoder, self.runtime.envs
        samples: list[Sample] = []
        while len(samples) < count:
            entries = len(self.config.env_manager.envs)
            requests: list[ResetRequest | None] = [
                ResetRequest(rng.randrange(entries), rng.randrange(2**31)) for _ in range(pool.num_slots)
            ]
            for outcome in pool.reset(requests):
                if outcome is not None and outcome.error is None and outcome.valid_actions:
                    action = rng.choice(outcome.valid_actions)
                    if rng.random() < expert_fraction:
                        action = _expert_action(outcome)
                    samples.append(_format_sample(enc, outcome, template.format(action=action)))
            if not samples:
                raise RuntimeError("warm-up needs envs with a list of valid actions (Valid actions: ...)")
        return samples[:count]

    # ------------------------------------------------------------------------------------------- evaluation

    def evaluate(self, step: int) -> Mapping[str, float]:
        """Greedy episodes on held-out seeds: success rate and return, overall and per env tag."""
        rollout = self.runtime.rollout(batch_seed=EVAL_SEED_BASE + step, greedy=True)
        return {
            k.removeprefix("env/"): v
            for k, v in rollout.metrics().items()
            if "/success_rate" in k or "/return" in k
        }

    # ------------------------------------------------------------------------------------------- checkpoints

    def save_files(self, directory: Path) -> None:
        self.actor.save_checkpoint(str(directory / ACTOR_FILES))

    def load_files(self, directory: Path) -> None:
        self.actor.load_checkpoint(str(directory / ACTOR_FILES))

    def state(self) -> Mapping[str, Any]:
        return {"version": self.updater.version}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.updater.sync(int(state["version"]))

    def run(self) -> dict[str, float]:
        try:
            return super().run()
        finally:
            if self.config.plot:
                try:
                    logger.info(
                        "plot: %s", plot_success(self.output_dir, ("env/success_rate", "eval/success_rate"))
                    )
                except Exception:  # a plotting problem must not fail a finished run
                    logger.warning("could not draw the success plot", exc_info=True)


def _expert_action(outcome: ResetOutcome) -> str:
    action = outcome.info.get(EXPERT_ACTION)
    if not isinstance(action, str):
        raise ConfigError(
            "warmup.expert_fraction > 0 needs envs that report info['expert_action'] after reset; an env of the "
            f"mix (system prompt {outcome.system_prompt[:60]!r}...) does not. Fix: set warmup.expert_fraction: 0, "
            "or report the expert action in the env's reset info (roll.agentic.types.EXPERT_ACTION)"
        )
    return action


def _format_sample(enc: Any, outcome: ResetOutcome, answer: str) -> Sample:
    messages = [
        {"role": "system", "content": outcome.system_prompt},
        {"role": "user", "content": outcome.observation},
    ]
    prompt = enc.prompt_ids(messages)
    response = [*enc.encode(answer), enc.eos_token_id]
    return Sample(
        input_ids=prompt + response,
        loss_mask=[0] * len(prompt) + [1] * len(response),
        logp=[0.0] * (len(prompt) + len(response)),
        score=0.0, group=0, episode=0, tag="warmup", success=False,
    )  # fmt: skip


def _timed(timings: dict[str, float], phase: str, fn: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    result = fn()
    timings[phase] = time.perf_counter() - start
    return result
