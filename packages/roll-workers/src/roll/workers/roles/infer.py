"""``ActorInferWorker``: generation and scoring with the current policy (hf by default, vllm as a plugin)."""

from __future__ import annotations

from typing import Any

import ray
import torch

from roll.core import columns as C
from roll.core.batch import PAD_COLUMN, Batch
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.core.errors import WorkerError
from roll.core.seeding import derive_seed
from roll.workers.config import SamplingParams
from roll.workers.model_update import (
    BucketMeta,
    CollectiveGroup,
    IPCHandles,
    LoadsFromIPC,
    TensorBucket,
    load_payload,
    open_tensors,
    receive_weights,
    weights_checksum,
)
from roll.workers.offload import measured
from roll.workers.roles import _common, partial
from roll.workers.roles.model import check_vocab, load_causal_lm, load_tokenizer, resolve_path
from roll.workers.roles.spec import GeneratorSpec
from roll.workers.types import GeneratedSample, InferStrategy

_PATH_BACKENDS = frozenset({"vllm"})
"""Backends that load the weights themselves from a folder or hub id (the worker hands them the path)."""


class ActorInferWorker(Worker):
    """One inference replica of the policy. Call :meth:`setup` on the cluster first.

    ``spec`` names the model and the infer strategy's config (``HFInferConfig`` for ``hf``).
    """

    def __init__(self, ctx: WorkerContext, spec: GeneratorSpec) -> None:
        super().__init__(ctx)
        self.spec = spec
        self.strategy: InferStrategy  # built by setup()
        self._groups: dict[str, CollectiveGroup] = {}

    @register(Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        """Load model and tokenizer and build the inference strategy through the ``roll.strategy`` plugins."""
        model_cfg, config = self.spec.model, self.spec.strategy
        plugin = _common.strategy_spec(config.type, "infer", self.role)
        tokenizer = load_tokenizer(model_cfg, self.role)
        if config.type in _PATH_BACKENDS:
            path = resolve_path(model_cfg.path, self.role, "model.path")
            self.strategy = _common.build_infer(plugin, config, path, self.role)
            return
        model = load_causal_lm(model_cfg, self.role)
        check_vocab(tokenizer, model, model_cfg, self.role)
        self.strategy = _common.build_infer(plugin, config, model, self.role, tokenizer=tokenizer)

    @register(Dispatch.DP_SPLIT)
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """``params.n`` samples per prompt row, ordered by (prompt, sample).

        Reads :data:`~columns.PROMPT_IDS` (or left-padded ``input_ids_BT`` + ``attention_mask_BT``), optional
        :data:`~columns.PROMPT_INDEX` (default: the row's index in the batch given to the cluster) and optional
        :data:`~columns.PROMPT_SEED` (each prompt's seed; default with ``params.seed``: ``derive_seed(params.seed,
        prompt_index)``, so the samples do not depend on how the cluster split the rows). Writes
        ``prompt_index_B``, ``sample_index_B``, ``policy_version_B`` and the non-tensor columns ``prompt_ids``,
        ``response_ids``, ``response_logp``, ``finish_reason``, ``text``; use :func:`~roll.data.sequences.to_sequences`
        (on the driver) to turn them into padded ``[B, T]`` tensors.
        """
        prompt_ids = _prompt_ids(prompts)
        index_B = _prompt_index(prompts, self.rank)
        seeds = _prompt_seeds(prompts, index_B, params)
        if partial.is_segment_request(prompts):  # partial rollout: one segment (roll.workers.roles.partial)
            if _common.vision_columns(prompts):
                raise WorkerError(f"{self.role}: partial rollout does not take image or video prompts yet")
            rows = Batch(dict(prompts.tensors), dict(prompts.non_tensors), prompts.meta)
            rows[C.PROMPT_IDS], rows[C.PROMPT_INDEX] = prompt_ids, index_B
            return partial.generate_segment(self.strategy, rows, params, seeds, self.role)
        samples = self.strategy.generate(prompt_ids, params, seeds, **_common.vision_kwargs(prompts))
        return _samples_batch(samples, prompts, prompt_ids, index_B, params.n)

    @register(Dispatch.DP_SPLIT)
    def compute_logprobs(self, batch: Batch, temperature: float = 1.0, with_entropy: bool = False) -> Batch:
        """Forward-only ``logp_BT`` (and ``entropy_BT``) under the served weights (zeroed outside
        ``response_mask_BT`` when the batch has it)."""
        mb = _common.micro_batch(batch)
        scores = self.strategy.compute_logprobs(
            mb[C.INPUT_IDS],
            mb[C.ATTENTION_MASK],
            response_mask=batch.tensors.get(C.RESPONSE_MASK),
            temperature=temperature,
            with_entropy=with_entropy,
            **_common.vision_kwargs(batch),
        )
        return _common.scores_batch(batch, **{C.LOGP: scores.logp_BT, C.ENTROPY: scores.entropy_BT})

    @register(Dispatch.ONE_TO_ALL)
    def update_weights(self, bucket_refs: list[Any], policy_version: int) -> int:
        """Load weight buckets (or a LoRA adapter bucket) from the object store, one at a time, and serve
        ``policy_version``."""
        for ref in bucket_refs:
            bucket: TensorBucket = ray.get(ref)
            load_payload(self.strategy, bucket.tensors(), bucket.meta.lora, policy_version)
        return self.strategy.policy_version

    @register(Dispatch.ONE_TO_ALL)
    def update_weights_ipc(self, handles: IPCHandles, meta: BucketMeta, policy_version: int) -> int:
        """Load one bucket a trainer rank on this GPU shared by CUDA IPC (``share_weight_bucket``) and serve
        ``policy_version``."""
        if isinstance(self.strategy, LoadsFromIPC) and meta.lora is None:
            self.strategy.load_weights_from_ipc(handles, policy_version)  # vLLM's workers map the memory
        else:
            named = open_tensors(handles, f"{self.role} rank {self.rank}")
            load_payload(self.strategy, named, meta.lora, policy_version)
            torch.cuda.synchronize()  # the trainer may free the bucket once every rank has answered
        return self.strategy.policy_version

    @register(Dispatch.ONE_TO_ALL)
    def join_update_group(
        self, name: str, addr: str, port: int, world_size: int, rank_offset: int, backend: str
    ) -> None:
        """Join the collective update group ``name`` as its rank ``rank_offset + self.rank``."""
        self._groups[name] = CollectiveGroup(addr, port, rank_offset + self.rank, world_size, backend)

    @register(Dispatch.ONE_TO_ALL)
    def receive_weights(self, name: str, policy_version: int) -> int:
        """Receive the broadcast of ``policy_version`` over group ``name`` and load it; returns the bucket count."""
        if name not in self._groups:
            raise WorkerError(f"{self.role} rank {self.rank}: not in update group {name!r}; join it first")
        return receive_weights(self._groups[name], policy_version, self.strategy)

    @register(Dispatch.ONE_TO_ALL)
    def policy_version(self) -> int:
        """The policy version of the weights this worker serves (0 = as loaded)."""
        return int(self.strategy.policy_version)

    @register(Dispatch.ONE_TO_ALL)
    def weights_checksum(self, dtype: str | None = None) -> str:
        """SHA-256 of the served weights (same recipe as the trainer's, see ``model_update.weights_checksum``)."""
        served = served_weights(self.strategy, self.role, self.spec.strategy.type)
        return weights_checksum(served, getattr(torch, dtype) if dtype else None)

    @register(Dispatch.ONE_TO_ALL)
    def offload(self) -> dict[str, float]:
        """Free the device while another role uses it (vLLM sleeps at its ``sleep_level``; hf moves weights to
        CPU); returns ``seconds`` and ``freed_bytes`` (:func:`roll.workers.offload.measured`)."""
        return measured(self.strategy.offload)

    @register(Dispatch.ONE_TO_ALL)
    def reload(self) -> dict[str, float]:
        """Wake up / move back; ``freed_bytes`` is then negative (memory taken back)."""
        return measured(self.strategy.reload)


def served_weights(strategy: InferStrategy, role: str, name: str) -> dict[str, torch.Tensor]:
    """The weights an in-process inference strategy serves (hf keeps a ``model``; vLLM's live in its engine)."""
    model = getattr(strategy, "model", None)
    if not isinstance(model, torch.nn.Module):
        raise WorkerError(f"{role}: strategy {name!r} does not expose its weights to this process")
    return model.state_dict()


def _prompt_ids(prompts: Batch) -> list[list[int]]:
    if C.PROMPT_IDS in prompts.non_tensors:
        return [list(map(int, p)) for p in prompts.non_tensors[C.PROMPT_IDS]]
    _common.require(prompts, C.INPUT_IDS, C.ATTENTION_MASK)
    ids_BT, mask_BT = prompts.tensors[C.INPUT_IDS], prompts.tensors[C.ATTENTION_MASK].bool()
    return [row[keep].tolist() for row, keep in zip(ids_BT, mask_BT)]


def _prompt_index(prompts: Batch, rank: int) -> torch.Tensor:
    """Given indices, else global row numbers: DP_SPLIT hands rank ``r`` rows ``r*b .. (r+1)*b - 1``."""
    if C.PROMPT_INDEX in prompts.tensors:
        return prompts.tensors[C.PROMPT_INDEX].long()
    return torch.arange(len(prompts)) + rank * len(prompts)


def _prompt_seeds(prompts: Batch, index_B: torch.Tensor, params: SamplingParams) -> list[int] | None:
    """Given per-prompt seeds, else seeds derived from ``params.seed`` and the global prompt index, else None."""
    if C.PROMPT_SEED in prompts.tensors:
        return [int(s) for s in prompts.tensors[C.PROMPT_SEED].tolist()]
    if params.seed is None:
        return None
    return [derive_seed(params.seed, int(i)) for i in index_B.tolist()]


def _samples_batch(
    samples: list[GeneratedSample], prompts: Batch, prompt_ids: list[list[int]], index_B: torch.Tensor, n: int
) -> Batch:
    local_B = torch.tensor([s.prompt_index for s in samples], dtype=torch.long)
    tensors = {
        C.PROMPT_INDEX: index_B[local_B],
        C.SAMPLE_INDEX: torch.tensor([s.sample_index for s in samples], dtype=torch.long),
        C.POLICY_VERSION: torch.tensor([s.policy_version for s in samples], dtype=torch.long),
    }
    if n > 1 and PAD_COLUMN in prompts.tensors:
        # Several rows per prompt: carry the pad mark so the cluster can drop padding prompts' samples.
        tensors[PAD_COLUMN] = prompts.tensors[PAD_COLUMN][local_B]
    non_tensors: dict[str, Any] = {
        C.PROMPT_IDS: [prompt_ids[i] for i in local_B.tolist()],
        C.RESPONSE_IDS: [s.token_ids for s in samples],
        C.RESPONSE_LOGP: [s.logprobs for s in samples],
        C.FINISH_REASON: [s.finish_reason for s in samples],
        C.TEXT: [s.text for s in samples],
    }
    return Batch(tensors, non_tensors, prompts.meta)
