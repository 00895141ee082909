"""``HybridActorWorker``: the policy's train and infer strategies in one process, time-sharing one device.

The colocated setup of RL on few GPUs (and ``placement: hybrid`` on CPU): one actor trains (fsdp2) and generates
(hf or another infer plugin), and a weight sync is a copy from the trainer's tensors into the inference model
inside the process (:func:`~roll.workers.model_update.sync_in_process`): no bucket is packed, nothing goes
through the object store or a process group. Under LoRA only the adapter moves (the inference side merges it,
see :mod:`roll.workers.lora`). With several ranks every rank gathers the full weights for its own inference copy
(a collective over the role).

One hybrid cluster can be a pipeline's train cluster *and* its infer cluster: it has every method pipelines call
on an :class:`~roll.workers.roles.actor.ActorTrainWorker` cluster (``train_step``, ``set_lr``,
``compute_logprobs``, ``save_checkpoint``/``load_checkpoint``, ``export_hf``, ``full_state_dict``,
``weights_checksum``, ``offload``/``reload``) and on an :class:`~roll.workers.roles.infer.ActorInferWorker`
cluster (``generate``, ``policy_version``), with the same signatures; ``offload``/``reload``/
``weights_checksum`` take an extra keyword ``side`` to pick one strategy. The model update is
``sync_weights``: ``ModelUpdateGroup(hybrid, hybrid)`` sees one cluster on both ends and uses it (mode
``in_process``). ``compute_logprobs`` scores with the trainer's weights, which equal the served ones after a
sync. To another process (a frozen reference that starts from the warmed-up weights) it sends like an
``ActorTrainWorker``, through the same part (:class:`~roll.workers.roles.sender.WeightSender`):
``ModelUpdateGroup(hybrid, reference)``.

On a GPU, ``offload(side="train")`` before generating and ``offload(side="infer")`` before training keep one
side off the device while the other works.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from roll.core.batch import Batch
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.workers.config import SamplingParams
from roll.workers.model_update import sync_in_process, weights_checksum
from roll.workers.offload import measured
from roll.workers.roles import _common, checkpoint
from roll.workers.roles.actor import LOSS_METRIC_PREFIX
from roll.workers.roles.infer import (
    _prompt_ids,
    _prompt_index,
    _prompt_seeds,
    _samples_batch,
    served_weights,
)
from roll.workers.roles.model import load_causal_lm
from roll.workers.roles.sender import WeightSender
from roll.workers.roles.spec import HybridSpec
from roll.workers.types import InferStrategy, LossFn, TrainStrategy

Side = Literal["train", "infer"]


class HybridActorWorker(Worker):
    """One rank of the policy holding both strategies. Call :meth:`setup` on the cluster first.

    ``spec.trainer``: what the train side trains (as for ``ActorTrainWorker``); ``spec.infer``: the infer
    strategy's config (``HFInferConfig``), over a second copy of the same model. Part ``sender`` sends the
    trainer's weights to another process (see the module docstring).
    """

    parts: ClassVar[Mapping[str, type]] = {"sender": WeightSender}

    def __init__(self, ctx: WorkerContext, spec: HybridSpec) -> None:
        super().__init__(ctx)
        _common.use_threads(spec.trainer.threads)
        self.spec = spec
        self.train: TrainStrategy  # built by setup()
        self.infer: InferStrategy
        self.tokenizer: Any = None
        self.sender = WeightSender(self, lambda: self.train)

    @register(Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        """Join the role's process group (world size > 1), then build both strategies, each on its own copy of
        the model (the trainer's may be sharded and wrapped; the inference copy stays a plain model)."""
        infer_plugin = _common.strategy_spec(self.spec.infer.type, "infer", self.role)
        self.train, self.tokenizer = _common.build_trainer(self, self.spec.trainer)
        infer_model = load_causal_lm(self.spec.trainer.model, self.role)
        self.infer = _common.build_infer(
            infer_plugin, self.spec.infer, infer_model, self.role, tokenizer=self.tokenizer
        )

    # ---- the train side (as ActorTrainWorker) ----------------------------------------------------------------

    @register(Dispatch.MP_SPLIT)  # as the trainer role's; with pure data parallelism it is DP_SPLIT
    def train_step(self, batch: Batch, loss_fn: LossFn, temperature: float = 1.0) -> dict[str, float]:
        """One optimizer step over the global batch (as :meth:`PolicyTrainer.train_step`)."""
        limit = _common.token_budget(self.spec.trainer)
        _common.check_micro_batch_fits(batch, limit, self.role, "strategy.max_tokens_per_micro_batch")
        return _common.train_on(self.train, batch, loss_fn, temperature, prefix=LOSS_METRIC_PREFIX)

    @register(Dispatch.ONE_TO_ALL)
    def set_lr(self, lr: float) -> None:
        """As :meth:`PolicyTrainer.set_lr`."""
        self.train.set_lr(lr)

    @register(Dispatch.MP_SPLIT)
    def compute_logprobs(self, batch: Batch, temperature: float = 1.0, with_entropy: bool = False) -> Batch:
        """``logp_BT`` (and ``entropy_BT``) under the trainer's current weights, forward only."""
        return _common.logprobs_of(self.train, batch, temperature, with_entropy)

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """The trainer's checkpoint and this process's RNG (as :meth:`PolicyTrainer.save_checkpoint`); the
        inference side holds no state of its own beyond the weights of the last sync."""
        checkpoint.save(self.train, Path(path), self.rank)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore the trainer; the inference side serves the restored weights after the next sync."""
        checkpoint.load(self.train, Path(path), self.rank)

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        """The trainer's weights as a ``save_pretrained`` folder plus the tokenizer."""
        self.train.export_hf(path)
        if self.rank == 0:
            self.tokenizer.save_pretrained(path)

    @register(Dispatch.ONE_TO_ALL)
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The trainer's full weights (LoRA merged) from rank 0, ``{}`` elsewhere. Collective."""
        state = self.train.state_dict()
        return state if self.rank == 0 else {}

    # ---- the infer side (as ActorInferWorker) ----------------------------------------------------------------

    @register(Dispatch.DP_SPLIT)
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """As :meth:`ActorInferWorker.generate`, with the weights of the last :meth:`sync_weights`."""
        prompt_ids = _prompt_ids(prompts)
        index_B = _prompt_index(prompts, self.rank)
        samples = self.infer.generate(prompt_ids, params, _prompt_seeds(prompts, index_B, params))
        return _samples_batch(samples, prompts, prompt_ids, index_B, params.n)

    @register(Dispatch.ONE_TO_ALL)
    def policy_version(self) -> int:
        """The policy version the inference side serves."""
        return self.infer.policy_version

    # ---- both ------------------------------------------------------------------------------------------------

    @register(Dispatch.ONE_TO_ALL)
    def sync_weights(self, policy_version: int, bucket_mb: float = 256.0) -> int:
        """Load the trainer's current weights (its adapter alone under LoRA) into this rank's inference model and
        serve them as ``policy_version``. Collective over the role. Returns the buckets handed over."""
        return sync_in_process(
            self.train, self.infer, policy_version, bucket_mb, all_ranks=self.world_size > 1
        )

    @register(Dispatch.ONE_TO_ALL)
    def weights_checksum(self, dtype: str | None = None, side: Side = "infer") -> str:
        """SHA-256 of the served weights (``infer``, every rank) or the trainer's (``train``: collective, rank 0's
        is the one), cast to ``dtype`` first when given."""
        cast = getattr(torch, dtype) if dtype else None
        if side == "train":
            state = self.train.state_dict()
            return weights_checksum(state, cast) if self.rank == 0 else ""
        return weights_checksum(served_weights(self.infer, self.role, self.spec.infer.type), cast)

    @register(Dispatch.ONE_TO_ALL)
    def offload(self, side: Side | None = None) -> dict[str, float]:
        """Move one side's weights (the trainer's with its optimizer state) off the device; both by default.
        Returns ``seconds`` and ``freed_bytes``, as the other roles' offload (:func:`roll.workers.offload.measured`)."""
        return measured(lambda: [strategy.offload() for strategy in self._sides(side)])

    @register(Dispatch.ONE_TO_ALL)
    def reload(self, side: Side | None = None) -> dict[str, float]:
        """Undo :meth:`offload` for one side, or both (``freed_bytes`` then negative: memory taken back)."""
        return measured(lambda: [strategy.reload() for strategy in self._sides(side)])

    def _sides(self, side: Side | None) -> list[TrainStrategy | InferStrategy]:
        if side is None:
            return [self.train, self.infer]
        return [self.train] if side == "train" else [self.infer]
