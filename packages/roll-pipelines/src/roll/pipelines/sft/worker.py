"""``SFTWorker``: a policy trainer and :class:`SFTEvaluation`, the two forward-only evaluation methods SFT needs
(token accuracy needs logits).

The role holds two parts (see :mod:`roll.core.cluster.dispatch`): a
:class:`~roll.workers.roles.actor.PolicyTrainer` (``setup``, ``train_step``, checkpoints, ``export_hf`` ...) and an
:class:`SFTEvaluation` over it. Both evaluation methods run on every rank (MP_SPLIT: rows split by data-parallel rank, so Megatron's TP/PP peers see the same rows;
plain DP_SPLIT for FSDP), so a sharded (FSDP) model takes part in each forward on every rank; rows that
dispatch added as padding are weighted 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from roll.core import columns as C
from roll.core.batch import PAD_COLUMN, Batch
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.core.columns import IGNORE_INDEX, LABELS
from roll.core.errors import WorkerError
from roll.pipelines.algorithms.aggregate import Aggregation
from roll.pipelines.algorithms.preference import sft_cross_entropy
from roll.workers.logprobs import position_ids_from_mask
from roll.workers.roles import _common
from roll.workers.roles.actor import PolicyTrainer
from roll.workers.roles.spec import TrainerSpec
from roll.workers.vision import next_positions, vision_inputs

TOKEN_SUM = Aggregation("token-mean", num_global_tokens=1.0)
"""A token *sum*: token-mean over a global count of 1."""


class SFTEvaluation:
    """:meth:`eval_step` and :meth:`generate_greedy` on ``trainer``'s model, a part of a training role."""

    def __init__(self, trainer: PolicyTrainer) -> None:
        self.trainer = trainer

    @register(Dispatch.MP_SPLIT)
    @torch.no_grad()
    def eval_step(self, batch: Batch) -> dict[str, float]:
        """Summed NLL, correctly predicted and trained tokens of this rank's real rows (``*_sum``: add them up).

        A dict, not a list: dispatch returns the per-rank dicts as they are (a list would be taken for rows and
        unpadded, which fails when dispatch padded the batch to split it evenly)."""
        model = self._transformers_model("eval_step")
        device = self.trainer.strategy.device
        ids_BT = batch.tensors[C.INPUT_IDS].to(device)
        mask_BT = batch.tensors[C.ATTENTION_MASK].to(device)
        labels_BT = batch.tensors[LABELS].to(device).clone()
        if PAD_COLUMN in batch.tensors:
            labels_BT[batch.tensors[PAD_COLUMN].to(device).bool()] = IGNORE_INDEX
        inputs = {
            "input_ids": ids_BT,
            "attention_mask": mask_BT,
            "position_ids": position_ids_from_mask(mask_BT),
        }
        inputs.update(vision_inputs(model, ids_BT, mask_BT, _common.vision_columns(batch)))  # image rows
        logits_BTV = model(**inputs, use_cache=False).logits.float()
        # logits at t predict token t + 1: shift the unshifted labels left by one.
        target_BT = torch.full_like(labels_BT, IGNORE_INDEX)
        target_BT[:, :-1] = labels_BT[:, 1:]
        trained_BT = target_BT != IGNORE_INDEX
        nll_sum = sft_cross_entropy(logits_BTV, target_BT, agg=TOKEN_SUM)
        correct = (logits_BTV.argmax(-1) == target_BT) & trained_BT
        return {
            "nll_sum": float(nll_sum),
            "correct_sum": float(correct.sum()),
            "tokens_sum": float(trained_BT.sum()),
        }

    @register(Dispatch.MP_SPLIT)
    @torch.no_grad()
    def generate_greedy(self, batch: Batch, max_new_tokens: int) -> Batch:
        """Greedy continuations of left-padded prompts, a fixed ``max_new_tokens`` steps on every rank (so a
        sharded model's collectives pair up; answers are cut at the stop token by the caller)."""
        model = self._transformers_model("generate_greedy")
        device = self.trainer.strategy.device
        ids_BT = batch.tensors[C.INPUT_IDS].to(device)
        mask_BT = batch.tensors[C.ATTENTION_MASK].to(device)
        inputs = {
            "input_ids": ids_BT,
            "attention_mask": mask_BT,
            "position_ids": position_ids_from_mask(mask_BT),
        }
        inputs.update(vision_inputs(model, ids_BT, mask_BT, _common.vision_columns(batch)))  # image prompts
        out = model(**inputs, use_cache=True)
        pos_BT = (
            next_positions(inputs["position_ids"])[:, None] - 1
        )  # 3-D image positions: go on after the last
        tokens: list[torch.Tensor] = []
        for i in range(max_new_tokens):
            next_B1 = out.logits[:, -1:].argmax(-1)
            tokens.append(next_B1)
            if i == max_new_tokens - 1:
                break
            mask_BT = torch.cat([mask_BT, torch.ones_like(next_B1)], dim=1)
            pos_BT = pos_BT[:, -1:] + 1
            out = model(
                input_ids=next_B1,
                attention_mask=mask_BT,
                position_ids=pos_BT,
                cache=out.cache,
                use_cache=True,
            )
        return Batch({C.GENERATED_IDS: torch.cat(tokens, dim=1).cpu()}, meta=batch.meta)

    def _transformers_model(self, method: str) -> torch.nn.Module:
        """The trained transformers model these evaluations run; the megatron strategy holds a ``GPTModel``."""
        model = self.trainer.strategy.model
        if not hasattr(model, "config"):  # Megatron's DDP-wrapped GPTModel has no HF config
            raise WorkerError(
                f"{self.trainer.role}.{method}: held-out evaluation (token accuracy, greedy answers) runs a "
                f"transformers forward, which strategy {self.trainer.spec.strategy.type!r} does not have; set "
                "eval_every: 0 (and no teacher warm-up summary), or use strategy.type fsdp2"
            )
        return model


class SFTWorker(Worker):
    """One data-parallel rank of the SFT policy (``spec``: what it trains). Call ``setup`` on the cluster first."""

    parts: ClassVar[Mapping[str, type]] = {"trainer": PolicyTrainer, "evaluation": SFTEvaluation}

    def __init__(self, ctx: WorkerContext, spec: TrainerSpec) -> None:
        super().__init__(ctx)
        self.trainer = PolicyTrainer(self, spec)
        self.evaluation = SFTEvaluation(self.trainer)
