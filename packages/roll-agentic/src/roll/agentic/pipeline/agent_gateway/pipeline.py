"""The agent-gateway pipeline: the user's agents play episodes through the gateway, the policy trains on what it
recorded. One step reads top to bottom::

    tasks -> rollout (gateway) -> rows -> advantages -> train -> sync_weights -> log   (checkpoint: the Run's)

- ``tasks``: :func:`step_tasks`, a seeded shuffle per pass over the task rows, a pure function of the step (so a
  resumed run plays the rows the uninterrupted one would, with no data position to save).
- ``rollout``: one :class:`~roll.agentic.gateway.agents.AgentGateway` (one HTTP server, on 127.0.0.1) over the
  policy's ``actor_infer`` (:class:`~roll.agentic.gateway.sampler.ClusterSampler`); agent errors and timeouts are
  env errors (shown once by :attr:`failures`, counted in ``agent/errors`` against ``failures.max_error_rate``).
- ``rows``: :func:`gateway_rows`: one row per choice of every call, the call's number as its segment, so that
  :func:`~roll.agentic.pipeline.agentic.trajectories.trajectory_advantages` gives every call of an episode the
  episode's one advantage and the loss counts an episode once (the agentic pipeline's machinery, composed).
- ``train`` / ``sync_weights``: :class:`~roll.pipelines.policy.group.PolicyGroup`, as every RL mode.

Simplifications, on purpose: the rollout is synchronous (no async ratio), and the gateway runs in the driver
process (its threads do HTTP and wait on the inference workers; agent code that needs its own processes starts
them itself).
"""

from __future__ import annotations

import importlib
import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from roll.agentic.env_manager.batching import to_batch
from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.episode import Sample
from roll.agentic.gateway.agents import AgentFn, AgentGateway, AgentRollout, load_agent
from roll.agentic.gateway.formats import render_messages
from roll.agentic.gateway.record import EpisodeLog
from roll.agentic.gateway.sampler import ClusterSampler
from roll.agentic.pipeline.agent_gateway import AgentConfig, AgentGatewayConfig, TaskDataConfig
from roll.agentic.pipeline.agentic.trajectories import trajectory_advantages
from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.config.sections import RoleConfig
from roll.core.errors import ConfigError, DataError
from roll.core.run import RunHost
from roll.core.seeding import derive_seed
from roll.core.types import Phases
from roll.pipelines.algorithms.losses import MaskedNLLLoss
from roll.pipelines.policy.group import PolicyGroup, policy_spec
from roll.pipelines.policy.objective import PolicyObjective
from roll.pipelines.policy.views import training_view
from roll.workers.roles.model import load_tokenizer

__all__ = [
    "AgentGatewayRecipe",
    "conversation_sample",
    "gateway_rows",
    "load_tasks",
    "resolve_agent",
    "step_tasks",
]

logger = logging.getLogger(__name__)


class AgentGatewayRecipe:
    """See the module docstring."""

    def __init__(self, config: AgentGatewayConfig, host: RunHost) -> None:
        self.config = config
        self.host = host
        a = config.algorithm
        self.objective = PolicyObjective(a)
        self.tasks = load_tasks(config.tasks)

    def phases(self) -> Phases:
        return Phases(warm_up=self.warm_up, teardown=self.teardown, export=self.export)

    def roles(self) -> Mapping[str, RoleConfig]:
        return self.config.policy_roles()

    def setup(self) -> None:
        cfg = self.config
        spec = policy_spec(
            cfg, warmup_steps=cfg.warmup.steps if cfg.warmup else 0, norm_len=cfg.rollout.max_new_tokens
        )
        self.policy = PolicyGroup(spec, self.host.make_cluster)
        self.policy.start()
        self.encoder = ChatEncoder(load_tokenizer(cfg.policy_model, "actor_infer"))
        sampler = ClusterSampler(self.policy.infer)
        self.gateway = AgentGateway(
            cfg.gateway, self.encoder, sampler, resolve_agent(cfg.agent), cfg.agent.type, sampling=cfg.rollout
        )

    # ------------------------------------------------------------------------------------------- the step

    def train_step(self, step: int) -> Mapping[str, float]:
        cfg, b = self.config, self.config.batch
        tasks = step_tasks(self.tasks, b.prompts_per_step, seed=cfg.seed, step=step)
        rollout = self.gateway.rollout(tasks, b.samples_per_prompt, seed=derive_seed(cfg.seed, step))
        self.host.failures.show(rollout.errors)  # an agent's first exception of each kind, with its traceback
        samples = gateway_rows(rollout)
        metrics = rollout.metrics()
        if self.host.train_samples_due():
            self.host.log_train_samples(
                sample_rows(rollout, self.host.samples.count, self.encoder.tokenizer.decode)
            )
        if samples:
            metrics["rollout/staleness_max"] = float(
                self.policy.version - min(s.policy_version for s in samples)
            )
            metrics.update(self.train(self.advantages(samples), step))
            self.policy.sync()
        else:
            logger.warning("step %d: no episode to train on (every one failed or made no call)", step)
            metrics["updates"] = 0.0  # counted by roll.core.failures (max_steps_without_update)
        metrics.update(self.policy.pop_phase_metrics())
        return self.log(metrics, samples, rollout)

    def advantages(self, samples: list[Sample]) -> Batch:
        """Padded rows with ``advantages_BT``: one advantage per episode, however many calls it made."""
        batch = to_batch(samples, self.encoder.pad_token_id)
        self.policy.prepare(batch, old_logp=self._use_old_logp())
        return trajectory_advantages(self.objective, batch)

    def train(self, batch: Batch, step: int) -> dict[str, float]:
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

    def log(
        self, metrics: dict[str, float], samples: list[Sample], rollout: AgentRollout
    ) -> dict[str, float]:
        out = {k if "/" in k else f"actor/{k}": v for k, v in metrics.items()}
        out["samples"] = float(len(samples))
        out["trajectories"] = float(len(rollout.episodes))
        out["tokens/trained"] = float(sum(sum(s.loss_mask) for s in samples))
        out["time/rollout_s"] = rollout.wall_s
        out["policy_version"] = float(self.policy.version)
        return out

    def _use_old_logp(self) -> bool:
        return self.config.batch.optimizer_steps_per_step > 1

    # ------------------------------------------------------------------------------------------- warm-up

    def warm_up(self) -> bool:
        """SFT on the warm-up conversations (see :class:`~.ConversationWarmupConfig`), then a weight sync."""
        wu = self.config.warmup
        if wu is None or self.policy.version != 0:
            return False
        rows = [conversation_sample(self.encoder, c, self.config.gateway.tool_call_format)
                for c in _read_jsonl(wu.path, "warmup.path")]  # fmt: skip
        rng = random.Random(self.config.seed)
        columns = (C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK)
        batches = (
            training_view(to_batch(rng.choices(rows, k=wu.batch_size), self.encoder.pad_token_id), columns)
            for _ in range(wu.steps)
        )
        metrics = self.policy.warmup_sft(
            batches, MaskedNLLLoss("response"), lr=wu.lr, log=self.host.tracker.log
        )
        logger.info("warm-up: %d steps, last nll %.3f", wu.steps, metrics.get("actor/nll", float("nan")))
        return True

    # ------------------------------------------------------------------------------------------- checkpoints

    def save_files(self, directory: Path) -> None:
        self.policy.save(directory)

    def load_files(self, directory: Path) -> None:
        self.policy.load(directory)

    def export(self, output_dir: Path) -> None:
        self.policy.export_hf(output_dir)

    def state(self) -> Mapping[str, Any]:
        return {**self.policy.state(), **self.objective.state_dict()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.objective.load_state_dict(state)
        self.policy.load_state(state)

    def teardown(self) -> None:
        """Close the gateway (before a restart after a lost worker, and at shutdown)."""
        if hasattr(self, "gateway"):
            self.gateway.close()


# ------------------------------------------------------------------------------------------- pure helpers


def resolve_agent(config: AgentConfig) -> AgentFn:
    """The agent of ``agent.type``: a ``roll.agent`` plugin built from ``options``, or ``module:function``."""
    if ":" not in config.type:
        return load_agent(config.type, config.options)
    module, name = config.type.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"agent.type {config.type!r}: cannot import it ({type(exc).__name__}: {exc})"
        ) from exc
    if not callable(fn):
        raise ConfigError(f"agent.type {config.type!r} is a {type(fn).__name__}, not a callable")
    return fn  # type: ignore[no-any-return]


def load_tasks(config: TaskDataConfig) -> list[dict[str, Any]]:
    """The task rows (inline, or read from the JSONL file)."""
    if config.rows is not None:
        return [dict(r) for r in config.rows]
    rows = _read_jsonl(str(config.path), "tasks.path")
    if not rows:
        raise DataError(f"tasks.path {config.path}: no task rows")
    return rows


def step_tasks(
    tasks: Sequence[Mapping[str, Any]], count: int, *, seed: int, step: int
) -> list[dict[str, Any]]:
    """The ``count`` rows of step ``step``: rows ``step * count ...`` of the run's endless sequence of passes,
    each pass a permutation of ``tasks`` seeded by ``(seed, pass)``."""
    out = []
    for i in range(step * count, (step + 1) * count):
        epoch, index = divmod(i, len(tasks))
        order = list(range(len(tasks)))
        random.Random(derive_seed(seed, epoch)).shuffle(order)
        out.append(dict(tasks[order[index]]))
    return out


def gateway_rows(rollout: AgentRollout) -> list[Sample]:
    """The rollout's training rows (:meth:`~roll.agentic.gateway.agents.AgentRollout.samples`: recorded ids
    only) with each call's number as its segment, so an episode's calls share its one advantage."""
    return [replace(s, segment=s.step) for s in rollout.samples()]


def conversation_sample(encoder: ChatEncoder, conversation: Mapping[str, Any], fmt: str = "hermes") -> Sample:
    """A warm-up row: the conversation's messages before its last (an assistant answer) rendered as the gateway
    renders a request, the answer as the format writes it, then the stop token; loss on the answer only."""
    messages, tools = conversation.get("messages"), conversation.get("tools")
    if not isinstance(messages, list) or len(messages) < 2 or messages[-1].get("role") != "assistant":
        raise DataError("a warm-up conversation needs 'messages' ending with the assistant's answer")
    prompt = encoder.prompt_ids(render_messages(messages[:-1], tools, fmt))
    full = render_messages(messages, tools, fmt)
    answer = [*encoder.encode(full[-1]["content"]), encoder.eos_token_id]
    return Sample(
        input_ids=prompt + answer,
        loss_mask=[0] * len(prompt) + [1] * len(answer),
        logp=[0.0] * (len(prompt) + len(answer)),
        score=0.0, group=0, episode=0, tag="warmup", success=False,
    )  # fmt: skip


def _read_jsonl(path: str, key: str) -> list[dict[str, Any]]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DataError(f"{key} {path}: {exc}") from exc
    rows = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{key} {path}, line {n}: not JSON ({exc})") from exc
            if not isinstance(row, dict):
                raise DataError(f"{key} {path}, line {n}: a row must be a JSON object")
            rows.append(row)
    return rows


def sample_rows(
    rollout: AgentRollout, count: int, decode: Callable[[list[int]], str]
) -> list[dict[str, Any]]:
    """``samples.jsonl`` rows of the first ``count`` episodes: the task row, and as the response what the policy
    wrote at each call (every choice, special tokens kept: a malformed tool call shows as written)."""
    return [
        {"prompt": json.dumps(e.task)[:500], "response": _transcript(e, decode), "calls": len(e.calls),
         "reward": e.reward, "success": e.reward > 0, "status": e.status}
        for e in rollout.started[:count]
    ]  # fmt: skip


def _transcript(episode: EpisodeLog, decode: Callable[[list[int]], str]) -> str:
    return "\n".join(
        f"[call {n}] " + " || ".join(decode(g.ids) for g in call.choices)
        for n, call in enumerate(episode.calls, 1)
    )
