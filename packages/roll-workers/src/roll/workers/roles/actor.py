"""``ActorTrainWorker``: the policy being trained (fsdp2 by default, any ``roll.strategy`` train plugin).

The role is three parts (see :mod:`roll.core.cluster.dispatch`): :class:`PolicyTrainer` (the strategy: train step,
log-probs, checkpoints, export, offload), :class:`~roll.workers.roles.sender.WeightSender` (the model update's
sending end) and :class:`~roll.workers.roles.topk_receiver.TopkReceiver` (a distillation student's top-k
receiving end). A role that trains the policy differently holds a ``PolicyTrainer`` with its own parts beside it
(roll-pipelines' SFT and distillation students do) instead of subclassing this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from roll.core.batch import Batch
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.workers.model_update import weights_checksum
from roll.workers.offload import measured
from roll.workers.roles import _common, checkpoint
from roll.workers.roles.model import copy_processor_files
from roll.workers.roles.sender import WeightSender
from roll.workers.roles.spec import TrainerSpec
from roll.workers.roles.topk_receiver import TopkReceiver
from roll.workers.types import LossFn, TrainStrategy

LOSS_METRIC_PREFIX = "actor/"
"""The prefix of the loss's own metrics in :meth:`PolicyTrainer.train_step`'s result."""


class PolicyTrainer:
    """A trained policy's strategy and its cluster methods, a part of a training role (see the module docstring).

    ``worker``: the role holding it (rank, process group); ``spec``: what it trains; ``build``: the strategy
    plugin's extra build arguments (``forward=...`` for a student that trains on its logits).
    """

    def __init__(self, worker: Worker, spec: TrainerSpec, **build: Any) -> None:
        _common.use_threads(spec.threads)
        self.worker = worker
        self.spec = spec
        self.strategy: TrainStrategy  # built by setup()
        self.tokenizer: Any = None
        self._build = build

    @property
    def role(self) -> str:
        return self.worker.role

    @property
    def rank(self) -> int:
        return self.worker.rank

    @register(Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        """Join the role's process group (world size > 1), load model and tokenizer, build the strategy."""
        self.strategy, self.tokenizer = _common.build_trainer(self.worker, self.spec, **self._build)

    @register(Dispatch.ONE_TO_ALL)
    def set_lr(self, lr: float) -> None:
        """Use ``lr`` as the base rate from now on (e.g. a warm-up at its own rate, then RL at another)."""
        self.strategy.set_lr(lr)

    @register(Dispatch.MP_SPLIT)
    def train_step(self, batch: Batch, loss_fn: LossFn, temperature: float = 1.0) -> dict[str, float]:
        """One optimizer step over the whole (global) batch; returns this rank's metrics.

        Metrics: ``loss`` (global mean over loss units), ``grad_norm`` (pre-clip), ``lr`` (used by this step),
        ``tokens`` (valid tokens of this rank's real rows), ``units`` (global loss units), and the loss's own
        metrics as ``actor/<name>`` (unit-weighted over this rank's micro-batches). ``loss_fn`` is pickled from the
        driver; it sees tensor columns under their Batch names plus ``input_ids``/``attention_mask``.
        """
        limit = _common.token_budget(self.spec)
        _common.check_micro_batch_fits(batch, limit, self.role, "strategy.max_tokens_per_micro_batch")
        return _common.train_on(self.strategy, batch, loss_fn, temperature, prefix=LOSS_METRIC_PREFIX)

    @register(Dispatch.MP_SPLIT)
    def compute_logprobs(self, batch: Batch, temperature: float = 1.0, with_entropy: bool = False) -> Batch:
        """``logp_BT`` (and ``entropy_BT``) of ``input_ids_BT`` under the current weights, forward only."""
        return _common.logprobs_of(self.strategy, batch, temperature, with_entropy)

    # ---- checkpoints and export ----------------------------------------------------------------------------

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Write model (rank 0, safetensors), optimizer + scheduler (full, rank 0) and each rank's RNG state.

        ``path`` must be on storage every rank can read for :meth:`load_checkpoint`. Collective.
        """
        checkpoint.save(self.strategy, Path(path), self.rank)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (every rank reads the full state, keeps its shard)."""
        checkpoint.load(self.strategy, Path(path), self.rank)

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        """A transformers ``save_pretrained`` folder plus the tokenizer (and a VLM's image processor config):
        ``AutoModelForCausalLM`` (``AutoModelForImageTextToText`` for a VLM) loads it."""
        self.strategy.export_hf(path)
        if self.rank == 0:
            self.tokenizer.save_pretrained(path)
            copy_processor_files(self.spec.model, Path(path), self.role)

    @register(Dispatch.ONE_TO_ALL)
    def offload(self) -> dict[str, float]:
        """Free the device between phases (weights, grads and optimizer state to CPU); returns ``seconds`` and
        ``freed_bytes`` (:func:`roll.workers.offload.measured`)."""
        return measured(self.strategy.offload)

    @register(Dispatch.ONE_TO_ALL)
    def reload(self) -> dict[str, float]:
        """Undo :meth:`offload`; ``freed_bytes`` is then negative (memory taken back)."""
        return measured(self.strategy.reload)

    @register(Dispatch.ONE_TO_ALL)
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights (LoRA merged) from rank 0, ``{}`` from other ranks. Collective; for tests and tools,
        not for the model update (see ``stage_weights``)."""
        state = self.strategy.state_dict()
        return state if self.rank == 0 else {}

    @register(Dispatch.ONE_TO_ALL)
    def weights_checksum(self, dtype: str | None = None) -> str:
        """SHA-256 of the full weights on rank 0 (``""`` on other ranks). Collective."""
        state = self.strategy.state_dict()
        return weights_checksum(state, getattr(torch, dtype) if dtype else None) if self.rank == 0 else ""


class ActorTrainWorker(Worker):
    """One data-parallel rank of the trained policy. Call ``setup`` on the cluster before anything else.

    ``spec`` says what it trains: the model, the train strategy's config (fsdp2 by default), the LR schedule's
    length and torch's thread count.
    """

    parts: ClassVar[Mapping[str, type]] = {
        "trainer": PolicyTrainer,
        "sender": WeightSender,
        "transfer": TopkReceiver,
    }

    def __init__(self, ctx: WorkerContext, spec: TrainerSpec) -> None:
        super().__init__(ctx)
        self.trainer = PolicyTrainer(self, spec)
        self.sender = WeightSender(self, lambda: self.trainer.strategy)
        self.transfer = TopkReceiver(self)
