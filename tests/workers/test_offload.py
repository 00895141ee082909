"""Offloading a trainer's state between phases (:mod:`roll.workers.offload`) on a real FSDP2 strategy, on CPU.

The mechanism is device-agnostic (storages released in place, bytes kept in host memory), so CPU shows what the
GPU path does: while offloaded every parameter, gradient and Adam tensor holds no memory, and training after a
reload is bit-identical to training that was never offloaded.
"""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from roll.core import columns as C
from roll.workers.config import FSDP2Config, OptimizerConfig
from roll.workers.fsdp2 import FSDP2TrainStrategy
from roll.workers.offload import StateOffloader, measured, train_state_tensors
from roll.workers.types import ForwardOutput, LossDefaults, MicroBatch


class TokenNLL(LossDefaults):
    def __call__(self, output: ForwardOutput, mb: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return -(output.logp_BT * mb[C.ATTENTION_MASK]).sum(), {}

    def count_units(self, mb: MicroBatch) -> float:
        return float(mb[C.ATTENTION_MASK].sum())


def _strategy() -> FSDP2TrainStrategy:
    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    cfg = FSDP2Config(device="cpu", optimizer=OptimizerConfig(lr=1e-2))
    return FSDP2TrainStrategy(Qwen2ForCausalLM(config), cfg, total_steps=4)


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 64, (4, 10), generator=torch.Generator().manual_seed(1))
    return {C.INPUT_IDS: ids, C.ATTENTION_MASK: torch.ones_like(ids)}


def _train(offload: bool) -> tuple[list[float], dict[str, torch.Tensor], list[float]]:
    strategy, batch, freed = _strategy(), _batch(), []
    offloader = StateOffloader()
    losses = []
    for _ in range(3):
        losses.append(strategy.train_step(batch, TokenNLL()).loss)
        if offload:
            freed.append(float(offloader.offload(train_state_tensors(strategy.model, strategy.optimizer))))
            assert all(t.untyped_storage().nbytes() == 0 for t in train_state_tensors(strategy.model, None))
            offloader.reload()
    return losses, {k: v.clone() for k, v in strategy.model.state_dict().items()}, freed


def test_training_is_unchanged_by_offload_and_reload() -> None:
    """Same losses, bit for bit, and the same final weights. Bytes freed after each step: P fp32 parameters
    (tied embeddings counted once) take 4P for the weights, 4P + 4P for Adam's two moments, plus one 4-byte
    ``step`` tensor per parameter tensor: 12 P + 4 n (the step's gradients were already dropped by
    ``zero_grad(set_to_none=True)``; a gradient that exists is offloaded too)."""
    plain_losses, plain_state, _ = _train(offload=False)
    losses, state, freed = _train(offload=True)
    assert losses == plain_losses and losses[-1] < losses[0]
    assert all(torch.equal(state[k], plain_state[k]) for k in plain_state)
    params = list(_strategy().model.parameters())
    P, n = sum(p.numel() for p in params), len(params)
    assert freed == [12.0 * P + 4 * n] * 3


def test_measured_reports_time_and_freed_bytes() -> None:
    out = measured(lambda: sum(range(1000)))
    assert set(out) == {"seconds", "freed_bytes"} and out["seconds"] >= 0
    assert out["freed_bytes"] == 0.0  # no CUDA here: nothing on a device to free
