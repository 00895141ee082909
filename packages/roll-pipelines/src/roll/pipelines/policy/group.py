"""The policy group: one trained policy and everything around it that every RL mode needs.

:class:`PolicyGroup` owns the train cluster (``actor_train``), the inference cluster (``actor_infer``), the
:class:`~roll.workers.model_update.ModelUpdateGroup` between them, and optionally a frozen ``reference`` (KL) and a
``critic`` (GAE). RL modes (rlvr, agentic, on-policy distillation) compose one; they differ in how they make a
batch and its advantages, never in a copy of this trainer. What it does, each a short method:

- :meth:`start`: build the clusters and set them up in parallel (Ray actors import torch concurrently);
- :meth:`warmup_sft`: an SFT warm-up on the train cluster at its own learning rate, then a weight sync;
- :meth:`old_logp`, :meth:`ref_logp`, :meth:`values`: the forward-only scores an advantage step needs;
- :meth:`train`: a seeded shuffle of the batch into ``optimizer_steps`` mini-batches, one optimizer step each,
  the critic training on the same mini-batches at the same time;
- :meth:`sync`: weights to the inference workers (and the reference after a warm-up), versioned;
- :meth:`save` / :meth:`load` / :meth:`export_hf` / :meth:`state` / :meth:`load_state`: checkpoints and export;
- :meth:`phase`: time-sharing for colocated roles: the side that is idle in a phase offloads (vLLM sleeps,
  trainers move their state to CPU) when ``actor_train`` and ``actor_infer`` name the same ``device_group``.

Placement ``hybrid`` holds train and infer strategies in one process (:class:`~roll.workers.roles.hybrid.
HybridActorWorker`): one cluster is both the train and the inference cluster, and a sync is an in-process copy.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

import numpy as np

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster, ClusterMethod, Mesh, Worker, WorkerRef
from roll.core.config.batch import BatchConfig
from roll.core.failures import RunStopped
from roll.core.tracking import reduce_metrics
from roll.pipelines.algorithms.losses import ValueLoss
from roll.pipelines.common.export import export_hf
from roll.pipelines.policy.config import Placement, PolicyRunConfig, SyncCheckConfig
from roll.pipelines.policy.critic import Critic
from roll.pipelines.policy.sync_check import SyncCheck
from roll.pipelines.policy.views import permutation, split_inert, training_view
from roll.workers.roles import role_ref
from roll.workers.roles.config import InferRoleConfig, ModelConfig, TrainRoleConfig, with_micro_batches
from roll.workers.roles.spec import GeneratorSpec, HybridSpec, TrainerSpec
from roll.workers.types import LossFn
from roll.workers.update_group import ModelUpdateGroup

if TYPE_CHECKING:
    import torch

    from roll.workers.roles.clusters import (
        ActorInferCluster,
        ActorTrainCluster,
        CriticCluster,
        GenerateCluster,
        HybridActorCluster,
        TrainCluster,
    )

logger = logging.getLogger(__name__)

MakeCluster = Callable[..., Cluster]
SEQUENCE_COLUMNS = (C.INPUT_IDS, C.ATTENTION_MASK)
POLICY_COLUMNS = (
    C.INPUT_IDS,
    C.ATTENTION_MASK,
    C.RESPONSE_MASK,
    C.INFER_LOGP,
    C.ADVANTAGES,
    C.OLD_LOGP,
    C.REF_LOGP,
    C.SEQ_UNITS,
    C.SEQ_TOKENS,
)
"""What the policy loss reads (those present in the batch go to ``actor_train``)."""
ACTOR_FILES, CRITIC_FILES = "actor", "critic"
REFERENCE_START = "reference_start"
"""Beside the ``step_*`` checkpoints: the warmed-up weights the reference holds (the RL start), for resumes."""


@dataclass(frozen=True)
class CriticSpec:
    """The critic role as it runs (its strategy resolved: the actor's when its own is unset), its model (``None``:
    the actor's) and its value loss."""

    role: TrainRoleConfig
    model: ModelConfig | None
    loss: LossFn


@dataclass(frozen=True)
class PolicySpec:
    """What a :class:`PolicyGroup` builds. ``total_steps`` sizes the LR schedule (warm-up steps included)."""

    actor: TrainRoleConfig
    infer: InferRoleConfig
    batch: BatchConfig
    total_steps: int
    reference: InferRoleConfig | None = None
    critic: CriticSpec | None = None
    cpu_threads: int | None = None
    bucket_mb: float = 256.0
    seed: int = 0
    placement: Placement = "separate"
    checkpoint_root: Path | None = None
    """Where the run's checkpoints go; a warm-up leaves the reference's start weights there (``reference_start``)."""
    non_finite: Literal["stop", "skip"] = "stop"
    """``failures.non_finite``: a NaN/inf loss or gradient norm stops the run (the strategies have already dropped
    that update), or the run goes on without it."""
    sync_check: SyncCheckConfig = field(default_factory=lambda: SyncCheckConfig(every=0))
    """The check after a weight sync (:mod:`~roll.pipelines.policy.sync_check`); off unless a mode passes its
    config's."""


def policy_spec(cfg: PolicyRunConfig, *, warmup_steps: int, norm_len: int) -> PolicySpec:
    """The :class:`PolicySpec` of a mode's config: its roles, the LR schedule's length (every optimizer step of
    the run, warm-up included) and the critic's value loss (``norm_len``: the rollout's max new tokens)."""
    a = cfg.algorithm
    critic = None
    if cfg.needs_critic:
        loss = ValueLoss(
            clip_range=a.value_clip, agg_mode=a.loss_agg_mode, norm_len=a.loss_agg_norm_len or norm_len
        )
        critic = CriticSpec(cfg.critic.resolved(cfg.actor_train), cfg.critic.model, loss)
    return PolicySpec(
        actor=cfg.actor_train, infer=cfg.actor_infer, batch=cfg.batch,
        total_steps=cfg.max_steps * cfg.batch.optimizer_steps_per_step + warmup_steps,
        reference=cfg.reference if cfg.needs_reference else None, critic=critic,
        cpu_threads=cfg.cpu_threads, bucket_mb=cfg.bucket_mb, seed=cfg.seed, placement=cfg.placement,
        checkpoint_root=cfg.checkpoint.dir or cfg.output_dir / "checkpoints",
        non_finite=cfg.failures.non_finite, sync_check=cfg.sync_check,
    )  # fmt: skip


class SetUp(Protocol):
    """A cluster whose role runs ``setup`` before its first call (every policy role, a teacher): a typed handle."""

    @property
    def setup(self) -> ClusterMethod[[], list[None]]: ...


class PolicyGroup:
    """See the module docstring. Build it in a recipe's ``setup`` with its host's ``make_cluster``."""

    def __init__(self, spec: PolicySpec, make_cluster: MakeCluster) -> None:
        self.spec = spec
        self._make_cluster = make_cluster
        self.actor: TrainCluster
        self.infer: GenerateCluster
        self.reference: ActorInferCluster | None = None
        self.critic: Critic | None = None
        self.updater: ModelUpdateGroup
        self.ref_updater: ModelUpdateGroup | None = None
        self._phase_metrics: dict[str, float] = {}
        self.sync_check = SyncCheck(spec.sync_check)

    # ------------------------------------------------------------------------------------------ building

    @property
    def model(self) -> ModelConfig:
        return self.spec.actor.model

    def start(
        self,
        *,
        actor_worker: type[Worker] | WorkerRef | None = None,
        also: Iterable[SetUp] = (),
    ) -> None:
        """Create the clusters and run every ``setup`` in parallel (``also``: the mode's other clusters that have a
        ``setup``, run with them; a reward cluster has none: it starts in its constructor). The roles' classes are named (:func:`~roll.workers.roles.role_ref`), not
        imported: their modules, and torch, load in the actors only. ``actor_worker``: the train role's class
        (default ``ActorTrainWorker``)."""
        actor_worker = actor_worker or role_ref("ActorTrainWorker")
        s = self.spec
        env = {"env_vars": {"OMP_NUM_THREADS": str(s.cpu_threads)}} if s.cpu_threads else None
        train_cfg = with_micro_batches(
            s.actor.strategy, s.batch.micro_batch_samples, s.batch.micro_batch_tokens
        )
        trainer = TrainerSpec(
            model=self.model, strategy=train_cfg, total_steps=s.total_steps, threads=s.cpu_threads
        )
        if s.placement == "hybrid":
            hybrid = HybridSpec(trainer=trainer, infer=s.infer.strategy)
            both = self._make_cluster(
                "actor_train", role_ref("HybridActorWorker"), init_args=(hybrid,), runtime_env=env
            )
            self.actor = self.infer = cast("HybridActorCluster", both)
        else:
            actor = self._make_cluster("actor_train", actor_worker, init_args=(trainer,), runtime_env=env)
            self.actor = cast("ActorTrainCluster", actor)
            self.infer = self._infer_cluster("actor_infer", s.infer, env)
        if s.reference is not None:
            self.reference = self._infer_cluster("reference", s.reference, env)
        critic = self._critic_cluster(env) if s.critic is not None else None
        clusters: list[SetUp | None] = [self.actor, self.infer, self.reference, critic, *also]
        unique = {id(c): c for c in clusters if c is not None}.values()  # a hybrid is actor and infer
        for call in [c.setup.submit() for c in unique]:
            call.result()
        if s.critic is not None and critic is not None:
            self.critic = Critic(critic, s.critic.loss)
        self.updater = ModelUpdateGroup(self.actor, self.infer, bucket_mb=s.bucket_mb)
        if self.reference is not None:
            self.ref_updater = ModelUpdateGroup(self.actor, self.reference, bucket_mb=s.bucket_mb)

    def _infer_cluster(
        self, role: str, cfg: InferRoleConfig, env: dict[str, Any] | None
    ) -> ActorInferCluster:
        spec = GeneratorSpec(model=cfg.model or self.model, strategy=cfg.strategy)
        cluster = self._make_cluster(role, role_ref("ActorInferWorker"), init_args=(spec,), runtime_env=env)
        return cast("ActorInferCluster", cluster)

    def _critic_cluster(self, env: dict[str, Any] | None) -> CriticCluster:
        s = self.spec
        assert s.critic is not None
        role = s.critic.role
        train_cfg = with_micro_batches(role.strategy, s.batch.micro_batch_samples, s.batch.micro_batch_tokens)
        spec = TrainerSpec(
            model=s.critic.model or self.model,
            strategy=train_cfg,
            total_steps=s.total_steps,
            threads=s.cpu_threads,
        )
        mesh = Mesh.for_role(role)  # from the strategy the critic runs, actor_train's when its own is unset
        cluster = self._make_cluster(
            "critic", role_ref("CriticWorker"), init_args=(spec,), runtime_env=env, mesh=mesh
        )
        return cast("CriticCluster", cluster)

    # ------------------------------------------------------------------------------------------ scores

    @property
    def version(self) -> int:
        """The policy version the inference workers serve (the number of syncs)."""
        return self.updater.version

    def prepare(self, batch: Batch, *, old_logp: bool) -> Batch:
        """The forward-only columns an advantage step reads, from the roles this group has: ``old_values_BT``
        (critic), ``ref_logp_BT`` (reference) and, with ``old_logp`` (several optimizer steps per rollout: the
        ratio's denominator must not move), ``old_logp_BT``."""
        if self.critic is not None:
            batch[C.OLD_VALUES] = self.values(batch)
        if self.reference is not None:
            batch[C.REF_LOGP] = self.ref_logp(batch)
        if old_logp:
            batch[C.OLD_LOGP] = self.old_logp(batch)
        return batch

    def old_logp(self, batch: Batch) -> torch.Tensor:
        """``old_logp_BT``: the trainer's log-probs of the rollout before this step trains (0 off the response)."""
        logp_BT = self.actor.compute_logprobs(training_view(batch, SEQUENCE_COLUMNS)).tensors[C.LOGP]
        return on_response(logp_BT, batch)

    def ref_logp(self, batch: Batch) -> torch.Tensor:
        """``ref_logp_BT`` from the frozen reference (0 off the response)."""
        assert self.reference is not None, "ref_logp needs a reference role"
        ref_BT = self.reference.compute_logprobs(training_view(batch, SEQUENCE_COLUMNS)).tensors[C.LOGP]
        return on_response(ref_BT, batch)

    def values(self, batch: Batch) -> torch.Tensor:
        """``old_values_BT`` from the critic, before it trains on this batch."""
        assert self.critic is not None, "values needs a critic role"
        return self.critic.values(batch)

    # ------------------------------------------------------------------------------------------ training

    def train(
        self,
        batch: Batch,
        loss: LossFn,
        *,
        optimizer_steps: int,
        columns: Iterable[str] = POLICY_COLUMNS,
        step: int,
        temperature: float = 1.0,
        train_actor: bool = True,
    ) -> dict[str, float]:
        """One optimizer step per mini-batch (with several, a shuffle seeded by ``(seed, step)`` into near-equal
        parts); the critic trains on the same mini-batches meanwhile. ``train_actor=False``: the critic alone.
        Rows whose gradient under ``loss`` is exactly zero stay out of the actor's forward, their loss units carried
        (:func:`~roll.pipelines.policy.views.without_inert_rows`); ``rows_skipped`` is their share of ``batch``.
        ``updates`` counts the optimizer steps that moved the policy: a row with a gradient and a finite norm
        (:mod:`roll.core.failures` stops a run with too many steps without one). A non-finite loss or gradient
        norm on any rank raises :class:`~roll.core.failures.RunStopped` naming step, role and rank, unless the
        spec's ``non_finite`` is ``skip``."""
        self.sync_check.remember(batch)
        parts = [batch]
        if optimizer_steps > 1:
            order = self.actor.apply(permutation, len(batch), self.spec.seed + step)
            parts = _near_equal_parts(batch.select(order), optimizer_steps)
        if self.critic is not None:
            self.critic.train(parts)
        metrics: dict[str, float] = {}
        if train_actor:
            per_rank: list[dict[str, float]] = []
            view, skipped, updates = tuple(columns), 0, 0
            for part in parts:
                # which rows move the gradient: the loss's tensor test, run where torch is (the train actor)
                trained, active, left_out = self.actor.apply(split_inert, training_view(part, view), loss)
                ranks = self.actor.train_step(trained, loss, temperature)
                finite = self._finite(self.actor.role, ranks, step)
                updates += int(active > 0 and finite)
                per_rank += ranks
                skipped += left_out
            metrics = reduce_metrics(per_rank, how={"tokens": "sum"})
            metrics["rows_skipped"] = skipped / len(batch)
            metrics["updates"] = float(updates)
        if self.critic is not None:
            critic = self.critic.collect()
            self._finite("critic", [critic], step)
            metrics.update(critic)
        return metrics

    def _finite(self, role: str, per_rank: list[dict[str, float]], step: int) -> bool:
        """Whether every rank's losses and gradient norm are finite; with ``non_finite: stop``, raise if not."""
        for rank, m in enumerate(per_rank):
            bad = {k: v for k, v in m.items() if k.endswith(("loss", "grad_norm")) and not math.isfinite(v)}
            if not bad:
                continue
            shown = ", ".join(f"{k} = {v}" for k, v in sorted(bad.items()))
            if self.spec.non_finite == "skip":
                logger.warning("step %d: %s rank %d: %s; update skipped", step + 1, role, rank, shown)
                return False
            raise RunStopped(
                f"stopped at step {step + 1}: role {role!r} rank {rank} has a non-finite {shown}; the update "
                "was not applied. Look for NaN/inf rewards or advantages, a too high learning rate or an "
                "overflow; failures.non_finite: skip drops such updates and goes on"
            )
        return True

    def warmup_sft(
        self,
        batches: Iterable[Batch],
        loss: LossFn,
        *,
        lr: float | None,
        log: Callable[[dict[str, float], int], None],
    ) -> dict[str, float]:
        """SFT on ``batches`` (at ``lr`` when given, then back to the RL rate), then push the weights to inference
        and, since the warmed-up model is the RL start, to the reference. Returns the last step's metrics."""
        base_lr = self.spec.actor.strategy.optimizer.lr
        if lr is not None:
            self.actor.set_lr(lr)
        batches = list(batches)
        metrics: dict[str, float] = {}
        start = time.perf_counter()
        for i, batch in enumerate(batches):
            metrics = reduce_metrics(self.actor.train_step(batch, loss))
            log({f"warmup/{k}": v for k, v in metrics.items()}, i - len(batches))
        self.actor.set_lr(base_lr)
        self.sync()
        if self.ref_updater is not None:
            self.ref_updater.sync(self.version)
            self._save_reference_start()
        logger.info("warm-up: %d steps in %.1fs", len(batches), time.perf_counter() - start)
        return metrics

    def _save_reference_start(self) -> None:
        """The reference now holds the warmed-up weights, not the model path's: keep them, atomically, so a resumed
        run's reference starts where this one's did."""
        root = self.spec.checkpoint_root
        if root is None:
            return
        tmp = root / f".tmp-{REFERENCE_START}"
        shutil.rmtree(tmp, ignore_errors=True)
        self.actor.save_checkpoint(str(tmp))
        shutil.rmtree(root / REFERENCE_START, ignore_errors=True)
        tmp.rename(root / REFERENCE_START)

    def sync(self, version: int | None = None) -> None:
        """Push the trained weights to the inference workers; the new policy version is ``version`` or +1. Then
        the sync check (:mod:`~roll.pipelines.policy.sync_check`) when due; its metrics join
        :meth:`pop_phase_metrics`."""
        self.updater.sync(version)
        self._phase_metrics.update(self.sync_check.after_sync(self.actor, self.infer, self.version))

    def check_sync(self) -> dict[str, float]:
        """The sync check now, whatever its cadence: ``mismatch/sync_logp_diff_{mean,max}`` (warns past the
        threshold). Needs a trained batch (the probe prompt comes from the first one)."""
        return self.sync_check.check(self.actor, self.infer, self.version)

    @contextmanager
    def phase(self, name: Literal["generate", "train"]) -> Iterator[None]:
        """Colocated roles (one ``device_group``) time-share: the side idle in this phase offloads meanwhile.
        What each offload and reload cost is kept for :meth:`pop_phase_metrics`."""
        s = self.spec
        shared = s.placement == "separate" and s.actor.device_group is not None
        if not shared or s.actor.device_group != s.infer.device_group:
            yield
            return
        idle = self.actor if name == "generate" else self.infer
        self._phase_metrics.update(phase_cost_metrics(idle.role, "offload", idle.offload()))
        try:
            yield
        finally:
            self._phase_metrics.update(phase_cost_metrics(idle.role, "reload", idle.reload()))

    def pop_phase_metrics(self) -> dict[str, float]:
        """The time-sharing metrics since the last call (``colocate/<role>_{offload,reload}_s``,
        ``colocate/<role>_freed_mib``; empty when the roles do not share devices) and the last sync check's
        (``mismatch/sync_*``)."""
        out, self._phase_metrics = self._phase_metrics, {}
        return out

    # ------------------------------------------------------------------------------------------ persistence

    def save(self, directory: Path) -> None:
        self.actor.save_checkpoint(str(directory / ACTOR_FILES))
        if self.critic is not None:
            self.critic.cluster.save_checkpoint(str(directory / CRITIC_FILES))

    def load(self, directory: Path) -> None:
        """Restore a checkpoint. A reference that a warm-up moved gets its start weights back first (from
        ``reference_start`` beside the checkpoint, copied beside this run's own checkpoints when they live
        elsewhere), through the actor, which then loads the checkpoint itself."""
        start = directory.parent / REFERENCE_START
        if self.ref_updater is not None and start.is_dir():
            self.actor.load_checkpoint(str(start))
            self.ref_updater.sync()
            root = self.spec.checkpoint_root
            if root is not None and not (root / REFERENCE_START).exists():
                root.mkdir(parents=True, exist_ok=True)
                shutil.copytree(start, root / REFERENCE_START)
        self.actor.load_checkpoint(str(directory / ACTOR_FILES))
        if self.critic is not None:
            self.critic.cluster.load_checkpoint(str(directory / CRITIC_FILES))

    def state(self) -> dict[str, Any]:
        return {"version": self.version, "sync_check": self.sync_check.state_dict()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore the served version: the inference workers get the checkpoint's weights (the reference keeps
        its start weights, see :meth:`load`); then the sync check's probe and counters, so a resumed run checks
        the same prompt on the same cadence."""
        self.sync(int(state["version"]))
        self._phase_metrics.clear()
        if "sync_check" in state:
            self.sync_check.load_state_dict(state["sync_check"])

    def export_hf(self, output_dir: Path) -> Path:
        """The trained policy as a transformers ``save_pretrained`` folder under ``output_dir/hf``."""
        return export_hf(self.actor, output_dir)


def phase_cost_metrics(role: str, kind: str, per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One offload or reload of ``role`` as metrics: the slowest rank's seconds (the phase waits for it) and,
    for an offload, the device memory freed, summed over ranks, in MiB."""
    out = {f"colocate/{role}_{kind}_s": max((r["seconds"] for r in per_rank), default=0.0)}
    if kind == "offload":
        out[f"colocate/{role}_freed_mib"] = sum(r["freed_bytes"] for r in per_rank) / 2**20
    return out


def on_response(values_BT: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``values_BT`` times the float32 response mask (0 off the response), in torch or numpy, whichever the
    columns are (a driver without torch holds numpy; the products are the same bits)."""
    mask_BT = batch.tensors[C.RESPONSE_MASK]
    if isinstance(values_BT, np.ndarray):
        masked: Any = values_BT * np.asarray(mask_BT).astype(np.float32)
        return masked
    return values_BT * mask_BT.float()


def _near_equal_parts(batch: Batch, parts: int) -> list[Batch]:
    parts = max(1, min(parts, len(batch)))
    sizes = [len(batch) // parts + (i < len(batch) % parts) for i in range(parts)]
    return list(batch.split(sizes))
