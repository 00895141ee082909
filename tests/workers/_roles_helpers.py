"""Shared bits of the worker-role tests: a picklable SFT loss, tiny batches, role configs."""

from __future__ import annotations

import sys

import ray
import torch

from roll.core.batch import Batch
from roll.workers.config import FSDP2Config, HFInferConfig, OptimizerConfig
from roll.workers.roles import ModelConfig
from roll.workers.roles import columns as C
from roll.workers.types import ForwardOutput, MicroBatch

# Ray workers cannot import the tests folder: ship this module's classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

MODEL = ModelConfig(path="tiny-1m")
OPTIM = OptimizerConfig(lr=1e-2, eps=1e-3)
"""``eps=1e-3``, as in test_fsdp2: Adam's first steps are ~``lr * sign(g)`` with a tiny eps, so gradients that
differ by summation order (1e-8) on parameters with ~0 true gradient would move by ``lr``; eps=1e-3 makes the
update Lipschitz in ``g`` and equal gradients give parameters equal to ~1e-7."""


def fsdp2(**kw: object) -> FSDP2Config:
    return FSDP2Config.model_validate({"device": "cpu", "optimizer": OPTIM, **kw})


def hf_infer() -> HFInferConfig:
    return HFInferConfig(device="cpu")


class TokenSumNLL:
    """SFT loss: summed NLL over ``response_mask_BT`` tokens; the units are those tokens."""

    needs_entropy = False

    def __call__(self, output: ForwardOutput, micro_batch: MicroBatch) -> torch.Tensor:
        return -(output.logp_BT * micro_batch[C.RESPONSE_MASK]).sum()

    def count_units(self, micro_batch: MicroBatch) -> float:
        return float(micro_batch[C.RESPONSE_MASK].sum())


def sequences(rows: int = 8, T: int = 12, seed: int = 0, vocab: int = 500) -> Batch:
    """Right-padded rows of lengths 5..T, the loss on every token after the first 3 (the "prompt")."""
    g = torch.Generator().manual_seed(seed)
    lengths_B = torch.randint(5, T + 1, (rows,), generator=g)
    mask_BT = (torch.arange(T)[None, :] < lengths_B[:, None]).long()
    ids_BT = torch.randint(3, vocab, (rows, T), generator=g) * mask_BT
    resp_BT = mask_BT.clone()
    resp_BT[:, :3] = 0
    return Batch(
        {
            C.INPUT_IDS: ids_BT,
            C.ATTENTION_MASK: mask_BT,
            C.RESPONSE_MASK: resp_BT,
            C.SAMPLE_ID: torch.arange(rows),
        }
    )
