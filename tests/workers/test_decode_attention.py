"""``roll_sdpa`` / ``roll_eager``: the one-token decode attention equals transformers' ``sdpa`` and the model's
``eager``, alone and inside a decode loop."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention, eager_attention_forward

from roll.workers.config import HFInferConfig, SamplingParams
from roll.workers.decode_attention import (
    EAGER_NAME,
    NAME,
    decode_attention_forward,
    eager_decode_attention_forward,
    use_decode_attention,
)
from roll.workers.hf_infer import HFInferStrategy

from .test_hf_infer import PROMPTS, tiny_model


class _Module(torch.nn.Module):
    """What the attention functions read from the calling module: the grouped-query factor."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


def _inputs(dtype: torch.dtype, q_len: int = 1) -> tuple[torch.Tensor, ...]:
    """6 rows, 8 query heads over 2 key/value heads, 13 cached positions, head dim 16; rows 0 and 3 left-padded
    (their first 4 and 2 positions masked), and keys/values a strided view of a longer buffer, as the decode
    loop's preallocated cache hands them over."""
    g = torch.Generator().manual_seed(0)
    query = torch.randn(6, 8, q_len, 16, generator=g).to(dtype)
    key = torch.randn(6, 2, 20, 16, generator=g).to(dtype)[:, :, :13]
    value = torch.randn(6, 2, 20, 16, generator=g).to(dtype)[:, :, :13]
    mask = torch.ones(6, 1, q_len, 13, dtype=torch.bool)
    mask[0, ..., :4] = mask[3, ..., :2] = False
    return query, key, value, mask


@torch.inference_mode()
@pytest.mark.parametrize("with_mask", [True, False])
def test_one_token_attention_equals_sdpa_in_float32(with_mask: bool) -> None:
    query, key, value, mask = _inputs(torch.float32)
    module = _Module(groups=4)
    got, _ = decode_attention_forward(module, query, key, value, mask if with_mask else None, scaling=0.25)
    want, _ = sdpa_attention_forward(module, query, key, value, mask if with_mask else None, scaling=0.25)
    assert got.shape == want.shape == (6, 1, 8, 16)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@torch.inference_mode()
def test_masked_positions_get_no_weight() -> None:
    """Row 0 masks its first 4 positions: changing their values must not change row 0's output, and changing an
    unmasked one must (so the first check could fail)."""
    query, key, value, mask = _inputs(torch.float32)
    module = _Module(groups=4)
    base, _ = decode_attention_forward(module, query, key, value, mask)
    poked = value.clone()
    poked[0, :, :4] = 1e4
    masked, _ = decode_attention_forward(module, query, key, poked, mask)
    torch.testing.assert_close(masked[0], base[0], atol=0, rtol=0)
    poked[0, :, 4] = 1e4
    unmasked, _ = decode_attention_forward(module, query, key, poked, mask)
    assert (unmasked[0] - base[0]).abs().max() > 1.0


@torch.inference_mode()
def test_one_token_attention_in_bfloat16_stays_near_float32() -> None:
    """bf16 keeps 8 bits of mantissa: outputs (weighted means of N(0, 1) values) within 0.05 of float32's."""
    q32, k32, v32, mask = _inputs(torch.float32)
    module = _Module(groups=4)
    want, _ = sdpa_attention_forward(module, q32, k32, v32, mask)
    got, _ = decode_attention_forward(module, *(t.bfloat16() for t in (q32, k32, v32)), mask)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0)


@torch.inference_mode()
def test_longer_queries_fall_through_to_sdpa_unchanged() -> None:
    query, key, value, mask = _inputs(torch.float32, q_len=3)
    module = _Module(groups=4)
    got, _ = decode_attention_forward(module, query, key, value, mask)
    want, _ = sdpa_attention_forward(module, query, key, value, mask)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


class _EagerModule(_Module):
    """A module whose modeling file is Qwen2's, so ``roll_eager`` falls back to Qwen2's ``eager``."""

    __module__ = Qwen2Attention.__module__


def _additive(mask: torch.Tensor) -> torch.Tensor:
    """The boolean mask as eager's additive float mask (0 = attend, the float minimum elsewhere)."""
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)


@torch.inference_mode()
@pytest.mark.parametrize("q_len", [1, 3])
def test_roll_eager_equals_the_models_eager_attention(q_len: int) -> None:
    """One token: the matmul path on an additive mask, within float summation order; longer queries: the model's
    own ``eager`` function, bit for bit."""
    query, key, value, mask = _inputs(torch.float32, q_len=q_len)
    module = _EagerModule(groups=4)
    got, _ = eager_decode_attention_forward(module, query, key, value, _additive(mask), scaling=0.25)
    want, _ = eager_attention_forward(module, query, key, value, _additive(mask), scaling=0.25)
    assert got.shape == want.shape == (6, q_len, 8, 16)
    torch.testing.assert_close(got, want, atol=1e-6 if q_len == 1 else 0, rtol=1e-5 if q_len == 1 else 0)


def _greedy_as_generate(implementation: str, name: str) -> None:
    """Greedy tokens of the switched model equal those of an untouched copy's ``model.generate``, and the
    log-probs agree to 1e-5 (the attention kernels differ only in float summation order)."""
    plain = tiny_model()
    plain.set_attn_implementation(implementation)
    strategy = HFInferStrategy(copy.deepcopy(plain), HFInferConfig(device="cpu"))
    assert strategy.model.config._attn_implementation == name
    samples = strategy.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=12))
    T = max(len(p) for p in PROMPTS)
    ids = torch.tensor([[0] * (T - len(p)) + p for p in PROMPTS])
    mask = (torch.arange(T)[None] >= torch.tensor([T - len(p) for p in PROMPTS])[:, None]).long()
    with torch.inference_mode():
        out = plain.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=12,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    assert [s.token_ids for s in samples] == out.sequences[:, T:].tolist()
    want_logp = torch.stack(out.scores, 1).log_softmax(-1).gather(-1, out.sequences[:, T:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor([s.logprobs for s in samples]), want_logp, atol=1e-5, rtol=0)


def test_the_strategy_switches_an_sdpa_model_and_decodes_as_sdpa_does() -> None:
    _greedy_as_generate("sdpa", NAME)


def test_the_strategy_switches_an_eager_model_and_decodes_as_eager_does() -> None:
    """A role with ``model.attn_implementation: eager`` (faster for the compiled CPU trainer) decodes fast too."""
    _greedy_as_generate("eager", EAGER_NAME)


def test_other_implementations_are_left_alone() -> None:
    model = tiny_model()
    model.set_attn_implementation("flex_attention")
    assert use_decode_attention(model) is False
    assert model.config._attn_implementation == "flex_attention"
