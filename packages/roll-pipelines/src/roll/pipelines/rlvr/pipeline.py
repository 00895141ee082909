"""The RLVR pipeline: reinforcement learning with verifiable rewards, on Ray actors.

One training step reads top to bottom (:meth:`RLVRRecipe.train_step`)::

    generate -> score -> advantages -> train -> sync_weights -> log      (checkpoint: the Run's cadence)

- ``generate``: the :class:`~roll.core.scheduler.GenerateScheduler` hands back ``P`` whole groups of ``G``
  samples, generated request by request on ``actor_infer`` and already scored by the reward workers (scoring
  overlaps generation), dynamic-sampling-filtered when the algorithm asks, and never staler than the bound.
- ``score``: ragged samples -> padded ``[B, T]`` sequences; reward shaping (DAPO overlong penalty, clipping,
  normalization) and the reward metrics per domain.
- ``advantages``: reference log-probs (KL), old log-probs (several optimizer steps per rollout), critic values
  (GAE), the estimator of the preset, KL in the reward when asked.
- ``train``: the :class:`~roll.pipelines.algorithms.losses.PolicyLoss` on ``actor_train``, one call per optimizer
  step; with a critic, the :class:`~roll.pipelines.algorithms.losses.ValueLoss` on ``critic`` at the same
  time, on the same mini-batches (see :mod:`roll.pipelines.rlvr.critic`).
- ``sync_weights``: :class:`~roll.workers.model_update.ModelUpdateGroup` pushes the new weights, versioned.

Simplifications, on purpose: the KL controller is updated once per step with the step's mean KL; GAE sees one
outcome reward on each response's last token (minus the per-token KL when it is in the reward).
"""

from __future__ import annotations

import logging
import math
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.config.sections import RoleConfig
from roll.core.run import RunHost
from roll.core.scheduler import GenerateOptions, GenerateScheduler, RankRequest, RolloutBatch
from roll.core.tracking import timed
from roll.core.types import Phases
from roll.data.vision import has_vision
from roll.pipelines.algorithms.losses import MaskedNLLLoss
from roll.pipelines.common.data import load_image_processor_for, load_tokenizer, prepare_data
from roll.pipelines.common.host import PipelineHost
from roll.pipelines.common.sampled_eval import sampled_metrics, vote_key
from roll.pipelines.curriculum import CurriculumFeeder, curriculum_feeder
from roll.pipelines.policy.group import PolicyGroup, policy_spec
from roll.pipelines.policy.objective import PolicyObjective
from roll.pipelines.policy.prefetch import StepAhead
from roll.pipelines.rlvr import metrics as M
from roll.pipelines.rlvr import tensor_work
from roll.pipelines.rlvr.config import RLVRConfig, reward_routes
from roll.pipelines.rlvr.data import CARRY_COLUMNS, IMAGE_COLUMNS, PromptFeeder, prompt_batch
from roll.pipelines.rlvr.scoring import reward_roles, start_rewards
from roll.pipelines.rlvr.transform import AdvantageTransform, TransformContext
from roll.workers.config import SamplingParams

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)
BUFFER_FILE = "rollout_buffer.pkl"
"""Partial rollout: the scheduler's buffers, open groups and in-flight requests (see ``buffer_state``)."""


class RLVRRecipe:
    """See the module docstring."""

    def __init__(
        self, config: RLVRConfig, host: RunHost, *, transform: AdvantageTransform | None = None
    ) -> None:
        self.config = config
        self.host = host
        self.transform = transform
        algo = config.algorithm
        self.objective = PolicyObjective(algo)
        self.domain_of, self.route_default = reward_routes(dict(config.rewards))
        only = next(iter(config.rewards)) if len(config.rewards) == 1 else None
        self.default_domain = self.route_default or only  # where an untagged row is scored (and counted)
        self.scheduler: GenerateScheduler | None = None

    # ------------------------------------------------------------------------------------------- roles

    def phases(self) -> Phases:
        return Phases(
            warm_up=self.warm_up,
            evaluate=self.evaluate,
            teardown=self.teardown,
            export=self.export,
            report=self._plot,
        )

    def roles(self) -> Mapping[str, RoleConfig]:
        cfg = self.config
        roles = cfg.policy_roles()
        roles.update(reward_roles(cfg.rewards))
        if self.transform is not None:
            roles.update(self.transform.roles())
        return roles

    def setup(self) -> None:
        cfg = self.config
        self.tokenizer = load_tokenizer(cfg.policy_model.tokenizer or cfg.policy_model.path)
        self.image_processor = load_image_processor_for(cfg.policy_model.path)  # None for a text model
        data = prepare_data(
            cfg.data,
            cfg.tokenize,
            kind="prompt",
            tokenizer=self.tokenizer,
            image_processor=self.image_processor,
        )
        self.with_images = has_vision(data.train)  # image prompts carry their images into their samples
        self.curriculum = self._curriculum()
        self.feeder = self.curriculum or PromptFeeder(data.train, seed=cfg.seed)
        self.eval_prompts = prompt_batch(data.eval[: cfg.validation.num_prompts]) if data.eval else None
        spec = policy_spec(
            cfg, warmup_steps=cfg.warmup.steps if cfg.warmup else 0, norm_len=cfg.rollout.max_new_tokens
        )
        self.policy = PolicyGroup(spec, self.host.make_cluster)
        extra = self.transform.prepare(self._transform_context()) if self.transform is not None else []
        # a hung reward: its rows fail, its worker restarts, training goes on (roll.pipelines.rlvr.scoring)
        self.rewards = start_rewards(self.host.make_cluster, cfg.rewards)
        self.policy.start(also=extra)
        self.scheduler = self._make_scheduler()
        step_ahead = cfg.rollout.async_mode == "step_ahead" and cfg.rollout.async_generation_ratio > 0
        # partial + step_ahead: only the first segment of the next step's prompts is made on this step's weights;
        # the rest continues after the sync, on the new ones (every sample switches version at the same token)
        self._prefetches = step_ahead and cfg.rollout.partial
        make = self._prefetch if self._prefetches else self.generate
        self.ahead: StepAhead[Any] = StepAhead(make, enabled=cfg.rollout.async_mode == "step_ahead")
        self._buffers: dict[str, Any] | None = (
            None  # partial: the rollout buffers of the checkpoint being saved
        )

    def _transform_context(self) -> TransformContext:
        """What :meth:`AdvantageTransform.prepare <roll.pipelines.rlvr.transform.AdvantageTransform.prepare>`
        may use of this run; built in ``setup``, after the data."""
        return TransformContext(
            host=PipelineHost.of(self.host),
            tokenizer=self.tokenizer,
            train_rows=self.feeder.rows,
            eval_prompts=self.eval_prompts,
        )

    def _curriculum(self) -> CurriculumFeeder | None:
        cfg = self.config
        if cfg.curriculum is None:
            return None
        return curriculum_feeder(
            cfg.curriculum, cfg.data, cfg.tokenize, tokenizer=self.tokenizer, seed=cfg.seed
        )

    def _make_scheduler(self) -> GenerateScheduler:
        cfg, r = self.config, self.config.rollout
        options = GenerateOptions(
            group_size=cfg.batch.samples_per_prompt,
            request_prompts=r.request_prompts,
            max_inflight_per_rank=r.max_inflight_per_rank,
            max_rounds=r.max_rounds,
            async_ratio=0.0 if r.async_mode == "step_ahead" else r.async_generation_ratio,
            # partial + step_ahead: prefetched first segments are one version old when their step is taken
            max_staleness=1
            if r.max_staleness is None and r.partial and r.async_mode == "step_ahead"
            else r.max_staleness,
            partial_segment=r.partial_segment_tokens if r.partial else None,
            version_column=C.POLICY_VERSION,
            carry_columns=CARRY_COLUMNS + (IMAGE_COLUMNS if self.with_images else ()),
            seed=cfg.seed,  # every prompt samples from (run seed, its place in the feed): resumable exactly
        )
        group_filter = self._group_filter if cfg.algorithm.dynamic_sampling else None
        params = self._sampling(n=cfg.batch.samples_per_prompt, temperature=r.temperature)
        return GenerateScheduler(
            RankRequest.bind(self.policy.infer.generate, params),
            self.feeder,
            options,
            scorer=self.rewards,
            group_filter=group_filter,
        )

    def _sampling(self, *, n: int, temperature: float, max_new_tokens: int | None = None) -> SamplingParams:
        r = self.config.rollout
        return SamplingParams(
            n=n, temperature=temperature, top_p=r.top_p, top_k=r.top_k,
            max_new_tokens=max_new_tokens or r.max_new_tokens,
        )  # fmt: skip

    def _group_filter(self, scored: Batch, group_size: int) -> tuple[Any, dict[str, float]]:
        from roll.pipelines.algorithms.dapo import dynamic_sampling_filter  # torch: DAPO's filter runs here

        a = self.config.algorithm
        result = dynamic_sampling_filter(
            scored.to_torch().tensors[C.SCORES].reshape(-1, group_size),
            min_std=a.dynamic_sampling_min_std,
            max_std=a.dynamic_sampling_max_std if a.dynamic_sampling_max_std is not None else math.inf,
        )
        return result.keep_P, {
            "all_equal": result.num_all_equal,
            "std_out_of_range": result.num_std_out_of_range,
        }

    # --------------------------------------------------------------------------------------- the step

    def train_step(self, step: int) -> Mapping[str, float]:
        level = self.curriculum.level if self.curriculum is not None else 0
        timings: dict[str, float] = {}
        with self.policy.phase("generate"), timed(timings, "generate"):
            rollout = self._take(step)
        self.ahead.start(
            step + 1
        )  # step_ahead: the next batch generates on these weights while this one trains
        with timed(timings, "score"):
            batch = self.score(rollout)
        self.show_errors(batch)
        if self.host.train_samples_due():  # a few rows for a person to read (roll.core.samples)
            self.host.log_train_samples(self.host.samples.pick(batch))
        with self.policy.phase("train"):
            with timed(timings, "advantages"):
                batch = self.advantages(batch)
            with timed(timings, "train"):
                train_metrics = self.train(batch)
        with timed(timings, "generate_wait"):
            self.ahead.wait()
        with timed(timings, "sync"):
            self.sync_weights()
        out = self.log(rollout, batch, {**train_metrics, **self.policy.pop_phase_metrics()}, timings)
        if self.curriculum is not None and self.config.curriculum is not None:
            # the level fed when this step began (with step_ahead, its prompts were fed a step earlier)
            out["curriculum/level"] = float(level)
            self.curriculum.observe(out[self.config.curriculum.metric])
        return out

    def _take(self, step: int) -> RolloutBatch:
        taken = self.ahead.take(step)
        return self.generate(step) if self._prefetches else taken

    def _prefetch(self, step: int) -> int:
        """partial + step_ahead: the first segment of ``step``'s prompts (see :meth:`GenerateScheduler.prefetch`)."""
        assert self.scheduler is not None  # built in setup()
        return self.scheduler.prefetch(self.config.batch.prompts_per_step)

    def generate(self, step: int = 0) -> RolloutBatch:
        """``P`` scored groups from the scheduler (see :mod:`roll.core.scheduler.generate`); ``step`` is the step
        they are for (the scheduler's feed decides the prompts)."""
        assert self.scheduler is not None  # built in setup()
        return self.scheduler.get_batch(self.config.batch.prompts_per_step, self.policy.version)

    def score(self, rollout: RolloutBatch) -> Batch:
        """Padded sequences, plus ``rewards_B``: the scores after overlong penalty and clipping (in the train
        actor, :mod:`.tensor_work`)."""
        return self.policy.actor.apply(
            tensor_work.score, rollout.batch, pad_id=self.tokenizer.pad_token_id,
            algorithm=self.config.algorithm, max_new_tokens=self.config.rollout.max_new_tokens,
        )  # fmt: skip

    def show_errors(self, scored: Batch) -> None:
        """The first reward error of each kind, with its traceback, on the driver's terminal (the rest are
        counted in ``reward/errors``; :mod:`roll.core.failures`)."""
        if C.REWARD_ERROR_REPORT in scored.non_tensors:
            self.host.failures.show(scored.non_tensors[C.REWARD_ERROR_REPORT])

    def advantages(self, batch: Batch) -> Batch:
        """Reference and old log-probs as needed, then the preset's advantage estimator."""
        if self.config.algorithm.overlong_filter:
            batch = self.policy.actor.apply(tensor_work.filter_overlong, batch)
        self.policy.prepare(batch, old_logp=self._use_old_logp())
        batch, self.objective = self.policy.actor.apply(
            tensor_work.advantages, batch, self.objective, group_size=self.config.batch.samples_per_prompt
        )
        return self.transform.advantages(batch) if self.transform is not None else batch

    def _use_old_logp(self) -> bool:
        # With one optimizer step per rollout the old policy *is* the current one: its log-probs come from the
        # training forward itself (detached), saving a forward pass.
        return self.config.batch.optimizer_steps_per_step > 1

    def train(self, batch: Batch) -> dict[str, float]:
        """The policy loss on ``actor_train``, one optimizer step per mini-batch; the critic trains on the same
        mini-batches meanwhile. During ``critic_warmup_steps`` only the critic trains."""
        loss = self.objective.loss(
            norm_len=self.config.rollout.max_new_tokens, use_old_logp=self._use_old_logp()
        )
        train_actor = self.policy.critic is None or self.host.step >= self.config.critic_warmup_steps
        metrics = self.policy.train(
            batch, loss, optimizer_steps=self.config.batch.optimizer_steps_per_step,
            step=self.host.step, temperature=self.config.rollout.temperature, train_actor=train_actor,
        )  # fmt: skip
        if train_actor:
            self.objective.observe(metrics, len(batch))
        return metrics

    def sync_weights(self) -> None:
        """Push the trained weights to the inference workers; the new policy version is the step count."""
        self.policy.sync()

    def log(
        self, rollout: RolloutBatch, batch: Batch, train: Mapping[str, float], timings: Mapping[str, float]
    ) -> dict[str, float]:
        out = {**rollout.metrics, **{f"actor/{k}" if "/" not in k else k: v for k, v in train.items()}}
        rollout_metrics, critic_metrics, gen_tokens, all_tokens = self.policy.actor.apply(
            tensor_work.step_metrics, batch, trainer_version=self.policy.version - 1,
            domain_of=self.domain_of, default=self.default_domain, critic=self.policy.critic is not None,
        )  # fmt: skip
        out.update(rollout_metrics)
        out.update(M.throughput(gen_tokens, timings["generate"], "generate"))
        out.update(M.throughput(all_tokens, timings["train"], "train"))
        out.update(M.throughput(all_tokens, timings["advantages"], "advantages"))
        out.update(
            M.throughput(gen_tokens, rollout.metrics.get("time/reward_request_s", 0.0) or 1e-9, "reward")
        )
        out.update(critic_metrics)
        out["time/sync_s"] = timings["sync"]
        out["time/score_s"] = timings["score"]
        out["actor/kl_coef"] = self.objective.kl.value
        out["policy_version"] = float(self.policy.version)
        out["reward/retried_rows_total"] = float(self.rewards.retried_requests)
        out["reward/worker_restarts_total"] = float(self.rewards.restarts)
        out["reward/timed_out_rows_total"] = float(self.rewards.timed_out_rows)
        if self.transform is not None:
            out.update(self.transform.metrics())
        return out

    # ------------------------------------------------------------------------------------------ warm-up

    def warm_up(self) -> bool:
        """SFT on ``warmup.data`` with the same trainer, then push the weights to inference (and reference)."""
        wu = self.config.warmup
        if wu is None or self.policy.version != 0:
            return False
        sft = prepare_data(
            wu.data,
            self.config.tokenize,
            kind="sft",
            tokenizer=self.tokenizer,
            image_processor=self.image_processor,
        ).train
        batches = self.policy.actor.apply(
            tensor_work.warmup_batches, [sft[i] for i in range(len(sft))], steps=wu.steps,
            batch_size=wu.batch_size, seed=self.config.seed, pad_id=self.tokenizer.pad_token_id,
        )  # fmt: skip
        metrics = self.policy.warmup_sft(
            batches, MaskedNLLLoss("labels"), lr=wu.lr, log=self.host.tracker.log
        )
        logger.info("warm-up: last nll %.3f", metrics.get("actor/nll", float("nan")))
        if self.config.eval_every:
            # step 0: the held-out score RL starts from, so a run shows what RL added beyond the warm-up
            self.host.tracker.log({f"eval/{k}": v for k, v in self.evaluate(0).items()}, 0)
        return True

    # ------------------------------------------------------------------------------------------- evaluation

    def evaluate(self, step: int) -> Mapping[str, float]:
        """Answers on held-out prompts (greedy by default): reward and accuracy, overall and per domain; with
        ``validation.samples_per_prompt: k > 1`` also mean@k, pass@k and maj@k (:meth:`_sampled_metrics`). The
        samples are seeded per prompt (the scheduler's evaluation stream), so two runs evaluate alike."""
        if self.eval_prompts is None or self.scheduler is None:
            return {}
        v = self.config.validation
        params = self._sampling(
            n=v.samples_per_prompt, temperature=v.temperature, max_new_tokens=v.max_new_tokens
        )
        params = params.model_copy(update={"temperature": v.temperature})
        samples = self.scheduler.generate_all(
            self.eval_prompts, RankRequest.bind(self.policy.infer.generate, params)
        )
        scored = self.rewards.score(samples)
        self.show_errors(scored)
        self.host.log_eval_samples(
            self.host.samples.pick(scored)
        )  # a few answers beside the accuracy (roll.core.samples)
        out: dict[str, float] = self.policy.actor.apply(
            tensor_work.eval_metrics, scored, domain_of=self.domain_of, default=self.default_domain
        )
        if v.samples_per_prompt > 1:
            out.update(self._sampled_metrics(scored, v.samples_per_prompt))
        return out

    def _sampled_metrics(self, scored: Batch, k: int) -> dict[str, float]:
        """``mean@k``, ``pass@k``, ``maj@k`` overall and ``domain/<d>/...`` per domain; ``scored`` holds ``k``
        answers per prompt, in prompt order."""
        answers = scored[C.REWARD_ANSWER] if C.REWARD_ANSWER in scored else [None] * len(scored)
        keys = [vote_key(a, t) for a, t in zip(answers, scored[C.TEXT])]
        correct = [bool(c) for c in scored[C.CORRECT].tolist()]
        domains = M.row_domains(scored, self.domain_of, default=self.default_domain)
        rows_by = {"": list(range(0, len(scored), k))}
        for p in rows_by[""]:
            rows_by.setdefault(f"domain/{domains[p]}/", []).append(p)
        out: dict[str, float] = {}
        for prefix, starts in rows_by.items():
            correct_PG = [correct[p : p + k] for p in starts]
            out.update(sampled_metrics(correct_PG, [keys[p : p + k] for p in starts], prefix=prefix))
        return out

    # ------------------------------------------------------------------------------------------- checkpoints

    def save_files(self, directory: Path) -> None:
        self.policy.save(directory)
        self.ahead.save(directory)
        if self._buffers is not None:  # taken in state(), together with the feeder's position
            with (directory / BUFFER_FILE).open("wb") as f:
                pickle.dump(self._buffers, f)
            self._buffers = None

    def load_files(self, directory: Path) -> None:
        self.policy.load(directory)
        self.ahead.load(directory)
        if (directory / BUFFER_FILE).exists():
            with (directory / BUFFER_FILE).open("rb") as f:
                self._buffers = pickle.load(f)  # written by save_files of the same pipeline

    def export(self, output_dir: Path) -> None:
        self.policy.export_hf(output_dir)

    def state(self) -> Mapping[str, Any]:
        """Data position (with a curriculum: its level and window), served version, KL controller, running
        reward statistics and the rollout scheduler's counters (the per-prompt seed stream's position)."""
        assert self.scheduler is not None  # built in setup()
        if (
            self.config.rollout.partial
        ):  # in-flight prompts and partial responses: taken with the feed position
            feeder, self._buffers = self.scheduler.buffer_state(self.feeder.state)
        else:
            feeder = self.feeder.state()
        state = {"feeder": feeder, **self.policy.state(), **self.objective.state_dict()}
        state["scheduler"] = self.scheduler.state_dict()
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        assert self.scheduler is not None  # built in setup()
        self.feeder.load_state(state["feeder"])
        self.objective.load_state_dict(state)
        self.scheduler.load_state_dict(state["scheduler"])
        if self._buffers is not None:
            self.scheduler.load_buffer_state(self._buffers)
            self._buffers = None
        self.policy.load_state(state)

    def teardown(self) -> None:
        """Stop the generator threads (before a restart after a lost worker, and at shutdown). The scheduler
        first: a step-ahead generation stuck on a call then leaves at once instead of at the call's deadline."""
        if self.scheduler is not None:
            self.scheduler.close()
            self.scheduler = None
        if hasattr(self, "ahead"):
            self.ahead.shutdown()

    def _plot(self) -> None:
        """The reward plot of the run (``plot``), drawn when the run ends (the run logs a failure to draw it,
        never raises it)."""
        if self.config.plot and (self.host.output_dir / "metrics.jsonl").exists():
            from roll.pipelines.rlvr.plot import plot_run

            logger.info("plot: %s", plot_run(self.host.output_dir))
