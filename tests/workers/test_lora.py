"""roll.workers.lora in process: the wire names of a peft model, the hf merger (exact, never twice, forgets a base
overwritten by full weights), and the peft folder that vLLM loads (peft itself reads it back to the same logits)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from roll.core import columns as C
from roll.core.errors import WorkerError
from roll.workers.config import HFInferConfig, LoraConfig
from roll.workers.fsdp2 import apply_lora, merge_lora_state_dict
from roll.workers.hf_infer import HFInferStrategy
from roll.workers.lora import LORA_A, LORA_B, wire_name, write_peft_adapter
from roll.workers.types import LossDefaults

LORA = LoraConfig(r=2, alpha=6, target_modules=["q_proj", "v_proj"])
IDS = torch.tensor([[3, 9, 27, 81, 17, 51]])


def tiny_model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=False)  # fmt: skip
    return Qwen2ForCausalLM(cfg).eval()


def random_adapter(peft_model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Give every lora_A/lora_B of ``peft_model`` random values; return them under wire names."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            wire = wire_name(name)
            if wire is not None:
                param.copy_(torch.randn(param.shape, generator=g) * 0.3)
                out[wire] = param.detach().clone()
    return out


def test_wire_names_and_merger_serve_the_merged_model_without_double_merging() -> None:
    peft_model = apply_lora(tiny_model(), LORA)
    adapters = [random_adapter(peft_model, seed) for seed in (1, 2)]
    assert len(adapters[0]) == 2 * 2 * 2  # A and B of q_proj and v_proj in 2 layers
    assert "model.layers.0.self_attn.q_proj" + LORA_A in adapters[0]
    expected = merge_lora_state_dict(peft_model.state_dict(), LORA)  # the trainer's merge, adapter 2
    infer = HFInferStrategy(tiny_model(), HFInferConfig(device="cpu"))
    for version, adapter in enumerate([adapters[0], adapters[1], adapters[1]], start=1):
        infer.load_adapter(adapter, LORA, version)  # 1, then 2 twice: 2 replaces 1, and never adds to itself
    assert infer.policy_version == 3
    for name, tensor in expected.items():
        assert torch.equal(infer.model.state_dict()[name], tensor), name
    with torch.no_grad():
        torch.testing.assert_close(infer.model(IDS).logits, peft_model(IDS).logits, atol=1e-5, rtol=0)


def test_full_weights_become_the_new_base() -> None:
    peft_model = apply_lora(tiny_model(), LORA)
    adapter = random_adapter(peft_model, 1)
    infer = HFInferStrategy(tiny_model(), HFInferConfig(device="cpu"))
    infer.load_adapter(adapter, LORA, 1)
    other = tiny_model(seed=5).state_dict()
    infer.load_weights(other, 2)  # full weights: the merger's pristine copies are stale now
    infer.load_adapter(adapter, LORA, 3)
    q = "model.layers.0.self_attn.q_proj"
    want = other[q + ".weight"] + adapter[q + LORA_B] @ adapter[q + LORA_A] * (LORA.alpha / LORA.r)
    torch.testing.assert_close(infer.model.state_dict()[q + ".weight"], want, atol=1e-6, rtol=0)


def test_unpaired_or_unknown_adapter_tensors_are_rejected() -> None:
    peft_model = apply_lora(tiny_model(), LORA)
    adapter = random_adapter(peft_model, 1)
    infer = HFInferStrategy(tiny_model(), HFInferConfig(device="cpu"))
    q = "model.layers.0.self_attn.q_proj"
    with pytest.raises(WorkerError, match="unpaired"):
        infer.load_adapter({q + LORA_A: adapter[q + LORA_A]}, LORA, 1)
    with pytest.raises(WorkerError, match="lacks"):
        infer.load_adapter({"no.such" + LORA_A: adapter[q + LORA_A], "no.such" + LORA_B: adapter[q + LORA_B]},
                           LORA, 1)  # fmt: skip


def test_sync_in_process_hands_over_the_adapter_alone() -> None:
    """A LoRA fsdp2 trainer (world size 1) and an hf strategy in one process: one bucket of A/B tensors, after
    which the hf model holds the trainer's merged weights, bit for bit, also after a second step and sync."""
    from roll.workers.config import FSDP2Config, OptimizerConfig
    from roll.workers.fsdp2 import FSDP2TrainStrategy
    from roll.workers.model_update import sync_in_process, weights_checksum

    cfg = FSDP2Config(device="cpu", optimizer=OptimizerConfig(lr=1e-2), lora=LORA)
    train = FSDP2TrainStrategy(tiny_model(), cfg)
    infer = HFInferStrategy(tiny_model(), HFInferConfig(device="cpu"))
    batch = {C.INPUT_IDS: IDS, C.ATTENTION_MASK: torch.ones_like(IDS), C.RESPONSE_MASK: torch.ones_like(IDS)}
    for version in (1, 2):
        train.train_step(batch, LogpSum())
        assert sync_in_process(train, infer, version, bucket_mb=1e-4) == 1  # whole adapter, one bucket
        assert weights_checksum(infer.model.state_dict()) == weights_checksum(train.state_dict())
    assert weights_checksum(infer.model.state_dict()) != weights_checksum(tiny_model().state_dict())


class LogpSum(LossDefaults):
    def __call__(self, output: Any, micro_batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return -(output.logp_BT * micro_batch[C.RESPONSE_MASK]).sum(), {}

    def count_units(self, micro_batch: Any) -> float:
        return float(micro_batch[C.RESPONSE_MASK].sum())


def test_peft_folder_loads_back_to_the_same_logits(tmp_path: Path) -> None:
    from peft import PeftModel

    peft_model = apply_lora(tiny_model(), LORA)
    adapter = random_adapter(peft_model, 1)
    folder = write_peft_adapter(tmp_path / "adapter", adapter, LORA, base_model="tiny")
    loaded = PeftModel.from_pretrained(copy.deepcopy(tiny_model()), str(folder)).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, peft_model(IDS).logits, atol=1e-6, rtol=0)
