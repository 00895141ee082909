"""``HybridActorWorker``: the policy's train and infer strategies in one process, time-sharing one device.

The colocated setup of RL on few GPUs (and ``placement: hybrid`` on CPU): one actor trains (fsdp2) and generates
(hf or another infer plugin), and a weight sync is a copy from the trainer's tensors into the inference model
inside the process (:func:`~roll.workers.model_update.sync_in_process`): no bucket is packed, nothing goes
through the object store or a process group. Under LoRA only the adapter moves (the inference side merges it,
see :mod:`roll.workers.lora`). With several ranks every rank gathers the full weights for its own inference copy
(a collective over the role).

The train side is the part an :class:`~roll.workers.roles.actor.ActorTrainWorker` holds,
:class:`~roll.workers.roles.actor.PolicyTrainer` (``parts``, see :mod:`roll.core.cluster.dispatch`), and so is
the sending end of a model update (:class:`~roll.workers.roles.sender.WeightSender`, over the trainer's strategy).
The class adds the inference side and overrides three of the trainer's methods (``overrides=True``), with the
part's signatures: ``setup`` (the trainer's, then the inference copy), ``offload``/``reload`` (both sides).

One hybrid cluster can be a pipeline's train cluster *and* its infer cluster: it has every method pipelines call
on an ``ActorTrainWorker`` cluster (``train_step``, ``set_lr``, ``compute_logprobs``,
``save_checkpoint``/``load_checkpoint``, ``export_hf``, ``full_state_dict``, ``weights_checksum``,
``offload``/``reload``: the trainer's own code) and on an :class:`~roll.workers.roles.infer.ActorInferWorker`
cluster (``generate``, ``policy_version``), with the same signatures. ``weights_checksum`` is the trainer's, as
on an ``ActorTrainWorker``; the served weights' checksum is :meth:`HybridActorWorker.served_checksum`. The model
update is ``sync_weights``: ``ModelUpdateGroup(hybrid, hybrid)`` sees one cluster on both ends and uses it (mode
``in_process``). ``compute_logprobs`` scores with the trainer's weights, which equal the served ones after a
sync. To another process (a frozen reference that starts from the warmed-up weights) it sends like an
``ActorTrainWorker``, through the same part: ``ModelUpdateGroup(hybrid, reference)``.

On a GPU, ``offload_side("train")`` before generating and ``offload_side("infer")`` before training keep one
side off the device while the other works (``reload_side`` brings it back).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

import torch

from roll.core.batch import Batch
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.workers.config import SamplingParams
from roll.workers.model_update import sync_in_process, weights_checksum
from roll.workers.offload import measured
from roll.workers.roles import _common
from roll.workers.roles.actor import PolicyTrainer
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
from roll.workers.types import InferStrategy, TrainStrategy

Side = Literal["train", "infer"]


class HybridActorWorker(Worker):
    """One rank of the policy holding both strategies. Call :meth:`setup` on the cluster first.

    ``spec.trainer``: what part ``trainer`` (:class:`PolicyTrainer`) trains, as for ``ActorTrainWorker``;
    ``spec.infer``: the infer strategy's config (``HFInferConfig``), over a second copy of the same model. Part
    ``sender`` sends the trainer's weights to another process (see the module docstring).
    """

    parts: ClassVar[Mapping[str, type]] = {"trainer": PolicyTrainer, "sender": WeightSender}

    def __init__(self, ctx: WorkerContext, spec: HybridSpec) -> None:
        super().__init__(ctx)
        self.spec = spec
        self.trainer = PolicyTrainer(self, spec.trainer)
        self.sender = WeightSender(self, lambda: self.trainer.strategy)
        self.infer: InferStrategy  # built by setup()

    @register(Dispatch.ONE_TO_ALL, overrides=True)
    def setup(self) -> None:
        """The trainer's :meth:`PolicyTrainer.setup` (joins the role's process group when world size > 1), then
        the inference strategy on a copy of its own (the trainer's may be sharded and wrapped; the inference copy
        stays a plain model)."""
        # an unknown infer type fails before the trainer loads anything
        infer_plugin = _common.strategy_spec(self.spec.infer.type, "infer", self.role)
        self.trainer.setup()
        infer_model = load_causal_lm(self.spec.trainer.model, self.role)
        self.infer = _common.build_infer(
            infer_plugin, self.spec.infer, infer_model, self.role, tokenizer=self.trainer.tokenizer
        )

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

    @register(Dispatch.ONE_TO_ALL)
    def served_checksum(self, dtype: str | None = None) -> str:
        """SHA-256 of the weights the inference side serves (every rank its own), cast to ``dtype`` first when
        given: what ``ActorInferWorker.weights_checksum`` is on a generator. ``weights_checksum`` is the
        trainer's (:meth:`PolicyTrainer.weights_checksum`)."""
        cast = getattr(torch, dtype) if dtype else None
        return weights_checksum(served_weights(self.infer, self.role, self.spec.infer.type), cast)

    # ---- both ------------------------------------------------------------------------------------------------

    @register(Dispatch.ONE_TO_ALL)
    def sync_weights(self, policy_version: int, bucket_mb: float = 256.0) -> int:
        """Load the trainer's current weights (its adapter alone under LoRA) into this rank's inference model and
        serve them as ``policy_version``. Collective over the role. Returns the buckets handed over."""
        return sync_in_process(
            self.trainer.strategy, self.infer, policy_version, bucket_mb, all_ranks=self.world_size > 1
        )

    @register(Dispatch.ONE_TO_ALL, overrides=True)
    def offload(self) -> dict[str, float]:
        """Move both sides' weights (the trainer's with its optimizer state) off the device. Returns ``seconds``
        and ``freed_bytes``, as the other roles' offload (:func:`roll.workers.offload.measured`)."""
        return measured(lambda: [strategy.offload() for strategy in self._sides(None)])

    @register(Dispatch.ONE_TO_ALL, overrides=True)
    def reload(self) -> dict[str, float]:
        """Undo :meth:`offload` (``freed_bytes`` then negative: memory taken back)."""
        return measured(lambda: [strategy.reload() for strategy in self._sides(None)])

    @register(Dispatch.ONE_TO_ALL)
    def offload_side(self, side: Side) -> dict[str, float]:
        """:meth:`offload` for one side only (``"train"``: the trainer with its optimizer state; ``"infer"``)."""
        return measured(lambda: [strategy.offload() for strategy in self._sides(side)])

    @register(Dispatch.ONE_TO_ALL)
    def reload_side(self, side: Side) -> dict[str, float]:
        """Undo :meth:`offload_side` for that side."""
        return measured(lambda: [strategy.reload() for strategy in self._sides(side)])

    def _sides(self, side: Side | None) -> list[TrainStrategy | InferStrategy]:
        train = self.trainer.strategy
        if side is None:
            return [train, self.infer]
        if side not in ("train", "infer"):
            raise ValueError(f"{self.role}: side must be 'train' or 'infer', got {side!r}")
        return [train] if side == "train" else [self.infer]
