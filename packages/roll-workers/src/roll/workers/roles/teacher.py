"""``TeacherWorker``: a frozen teacher for distillation: top-k logits per position, and log-probs.

Alignment (the log-prob convention of :mod:`roll.workers.types`): ``topk_values_BTK[b, t]`` are the teacher's
``k`` largest logits of the distribution of token ``t`` given ``ids[b, :t]`` (so they line up with ``logp_BT`` and
``response_mask_BT``), in descending order, with their vocabulary ids in ``topk_indices_BTK``; positions without a
prediction (the first token, padding) hold value 0 and index 0. Values are raw logits (temperature 1), float32.
"""

from __future__ import annotations

from typing import Any

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.workers import logits_transfer
from roll.workers.logprobs import has_prev_from_mask, position_ids_from_mask
from roll.workers.model_update import CollectiveGroup, free_port
from roll.workers.roles import _common
from roll.workers.roles.reference import FrozenScorer
from roll.workers.roles.spec import ScorerSpec
from roll.workers.vision import slice_vision, vision_inputs

_TOKENS_PER_FORWARD = 8192


class TeacherWorker(Worker):
    """One replica of the teacher (``spec``: the model and its strategy, ``hf`` by default)."""

    def __init__(self, ctx: WorkerContext, spec: ScorerSpec) -> None:
        super().__init__(ctx)
        self.scorer = FrozenScorer(self, spec)
        self._groups: dict[str, CollectiveGroup] = {}

    @register(Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        self.scorer.setup()

    @register(Dispatch.DP_SPLIT)
    def compute_logprobs(self, batch: Batch, temperature: float = 1.0, with_entropy: bool = False) -> Batch:
        """Reference-style ``logp_BT`` (and ``entropy_BT``) under the teacher."""
        return self.scorer.logprobs(batch, temperature, with_entropy)

    @register(Dispatch.DP_SPLIT)
    def topk_logits(self, batch: Batch, k: int) -> Batch:
        """``topk_values_BTK`` and ``topk_indices_BTK`` (see the module docstring); ``sample_id_B`` is kept."""
        values_BTK, indices_BTK = self._topk(batch, k)
        out = Batch({C.TOPK_VALUES: values_BTK, C.TOPK_INDICES: indices_BTK}, meta=batch.meta)
        if C.SAMPLE_ID in batch.tensors:
            out[C.SAMPLE_ID] = batch.tensors[C.SAMPLE_ID]
        return out

    @register(Dispatch.RANK_ZERO)
    def transfer_endpoint(self) -> tuple[str, int]:
        """Address and free port for a logits-transfer group hosted by this rank (rank 0 of the group)."""
        return self.node_ip, free_port()

    @register(Dispatch.ONE_TO_ALL)
    def join_transfer_group(
        self, name: str, addr: str, port: int, world_size: int, rank_offset: int, backend: str = "gloo"
    ) -> None:
        """Join the transfer group ``name`` as rank ``rank_offset + self.rank`` (teachers first, then students)."""
        self._groups[name] = CollectiveGroup(addr, port, rank_offset + self.rank, world_size, backend)

    @register(Dispatch.DP_SPLIT)
    def send_topk(self, batch: Batch, k: int, name: str, num_sources: int, key: str = "topk") -> int:
        """Compute top-k for this rank's rows (``sample_id_B`` required) and send each student, over group
        ``name``, the rows it holds; students call ``receive_topk`` (same ``key``) at the same time. Call it
        once per step: each call is a new round of channel ``key`` (see :mod:`roll.workers.logits_transfer`).
        Returns the rows computed (the cluster call gives the per-rank counts)."""
        _common.require(batch, C.SAMPLE_ID)
        real = _common.real_rows(batch)
        topk = self.topk_logits(real, k)
        logits_transfer.send_topk(self._groups[name], topk, src=self.rank, num_sources=num_sources, key=key)
        return len(real)

    @torch.no_grad()
    def _topk(self, batch: Batch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        mb = _common.micro_batch(batch)
        ids_BT, mask_BT = mb[C.INPUT_IDS], mb[C.ATTENTION_MASK]
        model = self.scorer.module()
        device = next(model.parameters()).device
        rows = max(1, _TOKENS_PER_FORWARD // max(1, ids_BT.shape[1]))
        values, indices = [], []
        images = _common.vision_columns(batch)
        for lo in range(0, ids_BT.shape[0], rows):
            ids, mask = ids_BT[lo : lo + rows].to(device), mask_BT[lo : lo + rows].to(device)
            v, i = _topk_rows(model, ids, mask, k, slice_vision(images, lo, lo + rows))
            values.append(v.cpu())
            indices.append(i.cpu())
        B, T = ids_BT.shape
        if not values:
            return torch.zeros(B, T, k), torch.zeros(B, T, k, dtype=torch.long)
        return torch.cat(values), torch.cat(indices)


def _topk_rows(
    model: torch.nn.Module, ids_BT: torch.Tensor, mask_BT: torch.Tensor, k: int, vision: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = {"input_ids": ids_BT, "attention_mask": mask_BT, "position_ids": position_ids_from_mask(mask_BT)}
    inputs.update(vision_inputs(model, ids_BT, mask_BT, vision))  # a VLM teacher sees the rows' images
    logits_BTV = model(**inputs, use_cache=False).logits
    top = logits_BTV[:, :-1].float().topk(k, dim=-1)
    B, T = ids_BT.shape
    values_BTK = torch.zeros(B, T, k)
    indices_BTK = torch.zeros(B, T, k, dtype=torch.long)
    values_BTK[:, 1:], indices_BTK[:, 1:] = top.values.cpu(), top.indices.cpu()
    keep_BT1 = has_prev_from_mask(mask_BT).cpu()[..., None]
    return values_BTK * keep_BT1, indices_BTK * keep_BT1
