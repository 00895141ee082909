"""``HybridActorWorker``: the policy's train and infer strategies in one process, time-sharing one device.

The colocated setup of RL on few GPUs: one actor trains (fsdp2) and generates (hf or another infer plugin), and a
weight sync is a copy from the trainer's tensors into the inference model inside the process
(:func:`~roll.workers.model_update.sync_in_process`): no bucket is packed, nothing goes through the object store
or a process group. Under LoRA only the adapter moves (the inference side merges it, see :mod:`roll.workers.lora`).
With several ranks every rank gathers the full weights for its own inference copy (a collective over the role).

On a GPU, :meth:`HybridActorWorker.offload` / :meth:`~HybridActorWorker.reload` move one side out while the other
works (``offload("train")`` before generating, ``offload("infer")`` before training).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.workers.config import SamplingParams
from roll.workers.model_update import sync_in_process, weights_checksum
from roll.workers.roles import _common
from roll.workers.roles.actor import LOSS_METRIC_PREFIX
from roll.workers.roles.config import ModelConfig
from roll.workers.roles.infer import _prompt_ids, _prompt_index, _samples_batch
from roll.workers.roles.model import check_vocab, load_causal_lm, load_tokenizer
from roll.workers.types import LossFn

Side = Literal["train", "infer"]


class HybridActorWorker(Worker):
    """One rank of the policy holding both strategies. Call :meth:`setup` on the cluster first.

    ``strategy``: config of the train plugin ``strategy_name`` (``FSDP2Config``); ``infer``: config of the infer
    plugin ``infer_name`` (``HFInferConfig``); ``threads``: torch intra-op threads.
    """

    def __init__(
        self,
        ctx: WorkerContext,
        model: ModelConfig,
        strategy: Any,
        infer: Any,
        total_steps: int = 1,
        strategy_name: str = "fsdp2",
        infer_name: str = "hf",
        threads: int | None = None,
    ) -> None:
        super().__init__(ctx)
        if threads:
            torch.set_num_threads(threads)
        self.model_cfg, self.strategy_cfg, self.infer_cfg = model, strategy, infer
        self.total_steps, self.strategy_name, self.infer_name = total_steps, strategy_name, infer_name
        self.train: Any = None
        self.infer: Any = None
        self.tokenizer: Any = None

    @register(Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        """Join the role's process group (world size > 1), then build both strategies, each on its own copy of
        the model (the trainer's may be sharded and wrapped; the inference copy stays a plain model)."""
        _common.join_default_group(self)
        train_spec = _common.strategy_spec(self.strategy_name, "train", self.role)
        infer_spec = _common.strategy_spec(self.infer_name, "infer", self.role)
        self.tokenizer = load_tokenizer(self.model_cfg, self.role)
        train_model = load_causal_lm(self.model_cfg, self.role)
        check_vocab(self.tokenizer, train_model, self.model_cfg, self.role)
        self.train = train_spec.build(self.strategy_cfg, train_model, total_steps=self.total_steps)
        infer_model = load_causal_lm(self.model_cfg, self.role)
        self.infer = infer_spec.build(self.infer_cfg, infer_model, tokenizer=self.tokenizer)

    @register(Dispatch.DP_SPLIT)
    def train_step(self, batch: Batch, loss_fn: LossFn, temperature: float = 1.0) -> dict[str, float]:
        """One optimizer step over the global batch (as :meth:`ActorTrainWorker.train_step`)."""
        limit = getattr(self.strategy_cfg, "max_tokens_per_micro_batch", None)
        _common.check_micro_batch_fits(batch, limit, self.role, "strategy.max_tokens_per_micro_batch")
        return _common.train_on(self.train, batch, loss_fn, temperature, prefix=LOSS_METRIC_PREFIX)

    @register(Dispatch.ONE_TO_ALL)
    def sync_weights(self, policy_version: int, bucket_mb: float = 256.0) -> int:
        """Load the trainer's current weights (its adapter alone under LoRA) into this rank's inference model and
        serve them as ``policy_version``. Collective over the role. Returns the buckets handed over."""
        return sync_in_process(
            self.train, self.infer, policy_version, bucket_mb, all_ranks=self.world_size > 1
        )

    @register(Dispatch.DP_SPLIT)
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """As :meth:`ActorInferWorker.generate`, with the weights of the last :meth:`sync_weights`."""
        prompt_ids = _prompt_ids(prompts)
        samples = self.infer.generate(prompt_ids, params)
        return _samples_batch(samples, prompts, prompt_ids, _prompt_index(prompts, self.rank), params.n)

    @register(Dispatch.DP_SPLIT)
    def compute_logprobs(self, batch: Batch, temperature: float = 1.0, with_entropy: bool = False) -> Batch:
        """``logp_BT`` (and ``entropy_BT``) under the trainer's current weights, forward only."""
        mb = _common.micro_batch(batch)
        scores = self.train.compute_logprobs(
            mb["input_ids"], mb["attention_mask"], temperature=temperature, with_entropy=with_entropy
        )
        return _common.scores_batch(batch, **{C.LOGP: scores.logp_BT, C.ENTROPY: scores.entropy_BT})

    @register(Dispatch.ONE_TO_ALL)
    def policy_version(self) -> int:
        """The policy version the inference side serves."""
        return int(self.infer.policy_version)

    @register(Dispatch.ONE_TO_ALL)
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The trainer's full weights (LoRA merged) from rank 0, ``{}`` elsewhere. Collective."""
        state: dict[str, torch.Tensor] = self.train.state_dict()
        return state if self.rank == 0 else {}

    @register(Dispatch.ONE_TO_ALL)
    def weights_checksum(self, side: Side = "infer") -> str:
        """SHA-256 of the served weights (``infer``, every rank) or the trainer's (``train``: collective, rank 0's
        is the one)."""
        if side == "train":
            state = self.train.state_dict()
            return weights_checksum(state) if self.rank == 0 else ""
        return weights_checksum(self.infer.model.state_dict())

    @register(Dispatch.ONE_TO_ALL)
    def offload(self, side: Side) -> None:
        """Move one side's weights (and the trainer's optimizer state) off the device."""
        (self.train if side == "train" else self.infer).offload()

    @register(Dispatch.ONE_TO_ALL)
    def reload(self, side: Side) -> None:
        (self.train if side == "train" else self.infer).reload()
