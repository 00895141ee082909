"""The agentic pipeline: multi-turn RL on env workers. One step reads top to bottom::

    rollout -> samples -> advantages -> train -> sync_weights -> log      (checkpoint: the Run's cadence)

- ``rollout``: the env manager plays ``P`` groups of ``G`` envs against ``actor_infer`` (one batched generate
  per turn); envs that hang are cut off and dropped; redundancy keeps the first groups to finish.
- ``samples``: trajectory-wise (one row per episode) or step-wise (one row per turn) token rows whose loss mask
  covers only model-sampled tokens.
- ``advantages``: reward normalization (``algorithm.reward_norm``: batch/group/tag/running), then the preset's
  estimator over episode groups, or GiGPO in step mode (``algorithm.adv_estimator: gigpo``) (:func:`~roll.pipelines.algorithms.estimators.estimate_advantages`).
- ``train``: the shared :class:`~roll.pipelines.algorithms.losses.PolicyLoss` (TIS included) on ``actor_train``,
  one call per optimizer step.
- ``sync_weights``: :class:`~roll.workers.model_update.ModelUpdateGroup` pushes the weights, versioned.

Optional parts, by config: a ``reference`` role when the KL term needs one, a ``critic`` role for GAE
(``algorithm.use_critic``), and ``rollout.async_generation_ratio: 1`` (step t+1 rolls out on the current weights while
step t trains); by default the rollout is synchronous, which keeps on-policy samples exact.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from roll.agentic.env_manager.batching import to_batch
from roll.agentic.env_manager.episode import Episode, Sample
from roll.agentic.env_manager.manager import Rollout
from roll.agentic.env_manager.slots import ResetOutcome, ResetRequest
from roll.agentic.pipeline.agentic import AgenticConfig
from roll.agentic.pipeline.agentic.trajectories import trajectory_advantages
from roll.agentic.pipeline.runtime import RolloutRuntime, plot_success
from roll.agentic.types import EXPERT_ACTION, split_observation
from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.config.sections import RoleConfig
from roll.core.errors import ConfigError
from roll.core.run import RunHost
from roll.core.samples import SampleRow, spread
from roll.core.tracking import timed
from roll.core.types import Phases
from roll.pipelines.algorithms.dapo import dynamic_sampling_rows
from roll.pipelines.algorithms.losses import MaskedNLLLoss
from roll.pipelines.policy.group import PolicyGroup, policy_spec
from roll.pipelines.policy.objective import PolicyObjective
from roll.pipelines.policy.prefetch import StepAhead
from roll.pipelines.policy.views import training_view

logger = logging.getLogger(__name__)
EVAL_SEED_BASE = 1_000_000_007


class AgenticRecipe:
    """See the module docstring."""

    def __init__(self, config: AgenticConfig, host: RunHost) -> None:
        self.config = config
        self.host = host
        self.objective = PolicyObjective(config.algorithm)

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
        return {**cfg.policy_roles(), "env_workers": cfg.env_workers}

    def setup(self) -> None:
        cfg, b = self.config, self.config.batch
        spec = policy_spec(
            cfg, warmup_steps=cfg.warmup.steps if cfg.warmup else 0, norm_len=cfg.rollout.max_new_tokens
        )
        self.policy = PolicyGroup(spec, self.host.make_cluster)
        self.policy.start()
        self.ahead = StepAhead(self.rollout, enabled=cfg.rollout.async_generation_ratio == 1)
        self.runtime = RolloutRuntime(
            cfg, self.host.make_cluster, b.prompts_per_step, b.samples_per_prompt, infer=self.policy.infer
        )

    # ------------------------------------------------------------------------------------------- the step

    def train_step(self, step: int) -> Mapping[str, float]:
        timings: dict[str, float] = {}
        with timed(timings, "rollout"):
            rollout = self.ahead.take(step)
        self.ahead.start(step + 1)  # async: step + 1 rolls out on the current weights while step trains
        self.host.failures.show(rollout.errors)  # an env's first exception of each kind, with its traceback
        if self.host.train_samples_due():  # a few trajectories for a person to read (roll.core.samples)
            self.host.log_train_samples(episode_samples(rollout, self.host.samples.count))
        samples = rollout.samples(self.config.env_manager.mode, self.config.env_manager.gamma)
        metrics = rollout.metrics()
        if self.config.algorithm.dynamic_sampling:
            samples, filtered = self._informative(samples)
            metrics.update(filtered)
        if samples:  # how many updates behind the trainer the oldest sampled token is (0 when synchronous)
            metrics["rollout/staleness_max"] = float(
                self.policy.version - min(s.policy_version for s in samples)
            )
            with timed(timings, "advantages"):
                batch = self.advantages(samples)
            with timed(timings, "train"):
                metrics.update(self.train(batch, step))
        else:
            logger.warning("step %d: no sample to train on (dropped or filtered)", step)
            metrics["updates"] = 0.0  # counted by roll.core.failures (max_steps_without_update)
        with timed(timings, "rollout_wait"):  # the next rollout ends on the weights it began with
            self.ahead.wait()
        if samples:
            with timed(timings, "sync"):
                self.sync_weights()
        metrics.update(self.policy.pop_phase_metrics())  # time-sharing costs, the sync check's gap
        return self.log(metrics, samples, timings)

    def _informative(self, samples: list[Sample]) -> tuple[list[Sample], dict[str, float]]:
        """Dynamic sampling (DAPO) over env groups: drop the groups whose episode scores are all equal (or whose
        std is outside ``algorithm.dynamic_sampling_min_std``/``max_std``); their advantages would be 0.
        ``env_manager.extra_groups`` rolls out spare groups to make up for them. Each trajectory counts once (its
        first segment stands for it)."""
        a = self.config.algorithm
        firsts = [s for s in samples if s.segment == 0]
        keep_F, result = dynamic_sampling_rows(
            torch.tensor([s.score for s in firsts], dtype=torch.float32),
            torch.tensor([s.group for s in firsts]),
            min_std=a.dynamic_sampling_min_std,
            max_std=a.dynamic_sampling_max_std if a.dynamic_sampling_max_std is not None else math.inf,
        )
        groups = {s.group for s, keep in zip(firsts, keep_F.tolist(), strict=True) if keep}
        kept = [s for s in samples if s.group in groups]
        metrics = {"rollout/groups_all_equal": float(result.num_all_equal)}
        metrics["rollout/groups_std_out_of_range"] = float(result.num_std_out_of_range)
        return kept, metrics

    def rollout(self, step: int) -> Rollout:
        return self.runtime.rollout(batch_seed=self.config.seed * 1_000_003 + step)

    def advantages(self, samples: list[Sample]) -> Batch:
        """Padded rows with ``advantages_BT`` and, for several optimizer steps per rollout, ``old_logp_BT``; one
        advantage per trajectory when a chat template split some (:mod:`.trajectories`)."""
        cfg = self.config
        batch = to_batch(samples, self.runtime.encoder.pad_token_id)
        gigpo = cfg.algorithm.gigpo_settings
        self.policy.prepare(batch, old_logp=self._use_old_logp())
        return trajectory_advantages(
            self.objective, batch, step_weight=gigpo.step_weight, norm_by_std=gigpo.norm_by_std
        )

    def train(self, batch: Batch, step: int) -> dict[str, float]:
        """The policy loss on ``actor_train``, one optimizer step per mini-batch; the critic trains on the same
        mini-batches meanwhile (alone during ``critic_warmup_steps``)."""
        cfg = self.config
        loss = self.objective.loss(norm_len=cfg.rollout.max_new_tokens, use_old_logp=self._use_old_logp())
        train_actor = self.policy.critic is None or step >= cfg.critic_warmup_steps
        metrics = self.policy.train(
            batch, loss, optimizer_steps=cfg.batch.optimizer_steps_per_step, step=step,
            temperature=cfg.rollout.temperature or 1.0, train_actor=train_actor,
        )  # fmt: skip
        if train_actor:
            self.objective.observe(metrics, len(batch))
        return metrics

    def sync_weights(self) -> None:
        self.policy.sync()

    def log(
        self, metrics: dict[str, float], samples: list[Sample], timings: Mapping[str, float]
    ) -> dict[str, float]:
        out = {k if "/" in k else f"actor/{k}": v for k, v in metrics.items()}
        out["samples"] = float(len(samples))  # rows: a trajectory split by the chat template has several
        out["trajectories"] = float(len({s.episode for s in samples}))
        out["tokens/trained"] = float(sum(sum(s.loss_mask) for s in samples))
        out.update({f"time/{k}_s": v for k, v in timings.items()})
        out["policy_version"] = float(self.policy.version)
        return out

    def _use_old_logp(self) -> bool:
        return self.config.batch.optimizer_steps_per_step > 1

    # ------------------------------------------------------------------------------------------- warm-up

    def warm_up(self) -> bool:
        """SFT on env prompts answered with uniformly random valid actions: the format, not the task."""
        wu = self.config.warmup
        if wu is None or self.policy.version != 0:
            return False
        rng = random.Random(self.config.seed)
        pad_id = self.runtime.encoder.pad_token_id
        columns = (C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK)
        batches = (
            training_view(
                to_batch(
                    self._warmup_samples(rng, wu.batch_size, wu.answer_template, wu.expert_fraction), pad_id
                ),
                columns,
            )
            for _ in range(wu.steps)
        )
        metrics = self.policy.warmup_sft(
            batches, MaskedNLLLoss("response"), lr=wu.lr, log=self.host.tracker.log
        )
        logger.info("warm-up: %d steps, last nll %.3f", wu.steps, metrics.get("actor/nll", float("nan")))
        return True

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
                    _answers_fit(enc, outcome.valid_actions, template, self.config.rollout.max_new_tokens)
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
        self.host.failures.show(rollout.errors)
        self.host.log_eval_samples(episode_samples(rollout, self.host.samples.count))
        return {
            k.removeprefix("env/"): v
            for k, v in rollout.metrics().items()
            if "/success_rate" in k or "/return" in k
        }

    # ------------------------------------------------------------------------------------------- checkpoints

    def save_files(self, directory: Path) -> None:
        """The policy, and in async mode the next step's rollout (generated by the pre-step weights), so a resumed
        run trains on what the uninterrupted one would have."""
        self.policy.save(directory)
        self.ahead.save(directory)

    def load_files(self, directory: Path) -> None:
        self.policy.load(directory)
        self.ahead.load(directory)

    def export(self, output_dir: Path) -> None:
        self.policy.export_hf(output_dir)

    def state(self) -> Mapping[str, Any]:
        return {**self.policy.state(), **self.objective.state_dict()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.objective.load_state_dict(state)
        self.policy.load_state(state)

    def teardown(self) -> None:
        """Stop the rollout thread (before a restart after a lost worker, and at shutdown)."""
        if hasattr(self, "ahead"):
            self.ahead.shutdown()

    def _plot(self) -> None:
        """The success-rate plot of the run (``plot``), drawn when the run ends (the run logs a failure to draw it,
        never raises it)."""
        if self.config.plot:
            logger.info(
                "plot: %s", plot_success(self.host.output_dir, ("env/success_rate", "eval/success_rate"))
            )


def _expert_action(outcome: ResetOutcome) -> str:
    action = outcome.info.get(EXPERT_ACTION)
    if not isinstance(action, str):
        raise ConfigError(
            "warmup.expert_fraction > 0 needs envs that report info['expert_action'] after reset; an env of the "
            f"mix (system prompt {outcome.system_prompt[:60]!r}...) does not. Fix: set warmup.expert_fraction: 0, "
            "or report the expert action in the env's reset info (roll.agentic.types.EXPERT_ACTION)"
        )
    return action


def _answers_fit(enc: Any, actions: tuple[str, ...] | list[str], template: str, max_new_tokens: int) -> None:
    """Every valid action, written as the warm-up teaches it and ended by EOS, fits in ``max_new_tokens``: else
    the rollout cuts that answer before its closing tag, it is never a valid action, and RL cannot learn to take
    it (the terminal example lost ``rm c.txt``, 17 tokens against 16, so the reward fell during RL)."""
    for action in actions:
        tokens = len(enc.encode(template.format(action=action))) + 1
        if tokens > max_new_tokens:
            raise ConfigError(
                f"rollout.max_new_tokens ({max_new_tokens}) is below the {tokens} tokens of the valid action "
                f"{action!r} as the warm-up writes it ({template!r} and EOS): generation would cut it, so the "
                f"policy could never take it. Fix: rollout.max_new_tokens: {tokens} or more"
            )


def _format_sample(enc: Any, outcome: ResetOutcome, answer: str) -> Sample:
    text, images = split_observation(outcome.observation)
    messages = [{"role": "system", "content": outcome.system_prompt}, {"role": "user", "content": text}]
    prompt, encoded = enc.prompt_with_images(messages, images)
    response = [*enc.encode(answer), enc.eos_token_id]
    return Sample(
        input_ids=prompt + response,
        loss_mask=[0] * len(prompt) + [1] * len(response),
        logp=[0.0] * (len(prompt) + len(response)),
        score=0.0, group=0, episode=0, tag="warmup", success=False, images=encoded,
    )  # fmt: skip


def episode_samples(rollout: Rollout, count: int) -> list[SampleRow]:
    """``count`` kept episodes spread over the rollout, each as a sample row: the first observation as the
    prompt, the conversation after it as the response, the episode's summed reward (what ``env/return``
    averages) as ``reward`` and ``episode_return``."""
    episodes = rollout.episodes
    return [_episode_row(episodes[i]) for i in spread(len(episodes), count)]


def _episode_row(episode: Episode) -> SampleRow:
    transcript = "\n".join(f"{m['role']}: {m['content']}" for m in episode.messages[2:])
    return {
        "prompt": episode.observation if not episode.turns else episode.turns[0].observation,
        "response": transcript,
        "tag": episode.tag,
        "seed": episode.seed,
        "reward": episode.total_reward,
        "episode_return": episode.total_reward,
        "success": episode.success,
        "turns": len(episode.turns),
        "status": episode.status,
    }
