"""HF <-> Megatron layout conversion (:mod:`roll.workers.megatron_convert`), on CPU, by exact round trips.

A tiny random Qwen2 (hidden 64, 2 layers, 4 heads, 2 kv heads, qkv bias) and a tied-embedding variant go HF ->
Megatron (TP 1 and 2, PP 1 and 2) -> HF and must come back bit-identical. The qkv interleave is also checked
against a hand-written example, so a round trip of two wrong-but-inverse functions cannot pass.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from roll.core.errors import ConfigError
from roll.workers.megatron_convert import (
    GPTLayout,
    hf_to_megatron,
    interleave_qkv,
    megatron_to_hf,
    shard_fc1,
    split_qkv,
    unshard_fc1,
)


def _qwen2_state(tie: bool) -> tuple[dict[str, torch.Tensor], Any]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    # Random biases too (they init to zero), so a misplaced bias row is visible.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_()
    return {k: v.clone() for k, v in model.state_dict().items()}, config


@pytest.fixture(scope="module")
def qwen2() -> tuple[dict[str, torch.Tensor], Any]:
    return _qwen2_state(tie=False)


def test_interleave_qkv_matches_hand_written_layout() -> None:
    """4 query heads, 2 kv heads, head_dim 1: rows q0 q1 k0 v0 | q2 q3 k1 v1 (group-major)."""
    q = torch.tensor([[10.0], [11.0], [12.0], [13.0]])  # heads q0..q3
    k = torch.tensor([[20.0], [21.0]])  # k0, k1
    v = torch.tensor([[30.0], [31.0]])  # v0, v1
    fused = interleave_qkv(q, k, v, num_heads=4, num_kv_heads=2)
    assert fused.squeeze(-1).tolist() == [10, 11, 20, 30, 12, 13, 21, 31]
    q2, k2, v2 = split_qkv(fused, num_heads=4, num_kv_heads=2, head_dim=1)
    assert torch.equal(q2, q) and torch.equal(k2, k) and torch.equal(v2, v)


def test_interleave_qkv_bias_and_head_dim_2() -> None:
    """Biases (1-D) with head_dim 2, one kv head (MQA): all query rows first, then k, then v."""
    q, k, v = torch.arange(4.0), torch.arange(10.0, 12.0), torch.arange(20.0, 22.0)
    fused = interleave_qkv(q, k, v, num_heads=2, num_kv_heads=1)
    assert fused.tolist() == [0, 1, 2, 3, 10, 11, 20, 21]


def test_fc1_shards_hold_gate_then_up_per_rank() -> None:
    gate = torch.arange(4.0)[:, None]  # rows g0..g3
    up = torch.arange(10.0, 14.0)[:, None]  # rows u0..u3
    shards = shard_fc1(gate, up, tp_size=2)
    assert [s.squeeze(-1).tolist() for s in shards] == [[0, 1, 10, 11], [2, 3, 12, 13]]
    gate2, up2 = unshard_fc1(shards)
    assert torch.equal(gate2, gate) and torch.equal(up2, up)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_round_trip_is_exact(qwen2: tuple[dict[str, torch.Tensor], Any], tp_size: int) -> None:
    hf_state, config = qwen2
    layout = GPTLayout.from_hf_config(config, tp_size=tp_size, vocab_multiple=8)
    shards = hf_to_megatron(hf_state, layout, tp_size=tp_size)
    assert len(shards) == tp_size
    back = megatron_to_hf(shards, layout)
    assert set(back) == set(hf_state)
    for name, tensor in hf_state.items():
        assert torch.equal(back[name], tensor), name


def test_tp2_shapes_and_names(qwen2: tuple[dict[str, torch.Tensor], Any]) -> None:
    """Shard shapes follow Megatron: column-parallel rows halve, row-parallel columns halve, vocab padded."""
    hf_state, config = qwen2
    layout = GPTLayout.from_hf_config(config, tp_size=2, vocab_multiple=8)
    rank0 = hf_to_megatron(hf_state, layout, tp_size=2)[0]
    d = 64 // 4
    assert layout.padded_vocab_size == 112  # 100 rounded up to a multiple of 8 * 2
    assert rank0["embedding.word_embeddings.weight"].shape == (56, 64)
    assert rank0["output_layer.weight"].shape == (56, 64)
    assert rank0["decoder.layers.0.self_attention.linear_qkv.weight"].shape == ((4 + 2 * 2) * d // 2, 64)
    assert rank0["decoder.layers.0.self_attention.linear_qkv.bias"].shape == ((4 + 2 * 2) * d // 2,)
    assert rank0["decoder.layers.0.self_attention.linear_proj.weight"].shape == (64, 32)
    assert rank0["decoder.layers.1.mlp.linear_fc1.weight"].shape == (96, 64)
    assert rank0["decoder.layers.1.mlp.linear_fc2.weight"].shape == (64, 48)
    assert rank0["decoder.layers.0.input_layernorm.weight"].shape == (64,)
    assert torch.equal(rank0["decoder.final_layernorm.weight"], hf_state["model.norm.weight"])


def test_tp2_rank1_holds_second_query_group(qwen2: tuple[dict[str, torch.Tensor], Any]) -> None:
    """With 2 kv heads over 2 ranks, rank 1's qkv is exactly query heads 2-3, k head 1, v head 1."""
    hf_state, config = qwen2
    layout = GPTLayout.from_hf_config(config, tp_size=2, vocab_multiple=8)
    rank1 = hf_to_megatron(hf_state, layout, tp_size=2)[1]
    d, p = 16, "model.layers.0.self_attn."
    expected = torch.cat(
        [
            hf_state[p + "q_proj.weight"][2 * d : 4 * d],
            hf_state[p + "k_proj.weight"][d : 2 * d],
            hf_state[p + "v_proj.weight"][d : 2 * d],
        ]
    )
    assert torch.equal(rank1["decoder.layers.0.self_attention.linear_qkv.weight"], expected)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_pipeline_stages_round_trip(qwen2: tuple[dict[str, torch.Tensor], Any], tp_size: int) -> None:
    hf_state, config = qwen2
    layout = GPTLayout.from_hf_config(config, tp_size=tp_size, vocab_multiple=8)
    merged: dict[str, torch.Tensor] = {}
    for pp_rank in range(2):
        shards = hf_to_megatron(hf_state, layout, tp_size=tp_size, pp_size=2, pp_rank=pp_rank)
        # Stages number their layers locally from 0.
        assert "decoder.layers.0.mlp.linear_fc1.weight" in shards[0]
        assert "decoder.layers.1.mlp.linear_fc1.weight" not in shards[0]
        assert ("embedding.word_embeddings.weight" in shards[0]) == (pp_rank == 0)
        assert ("output_layer.weight" in shards[0]) == (pp_rank == 1)
        merged.update(megatron_to_hf(shards, layout, pp_size=2, pp_rank=pp_rank))
    assert set(merged) == set(hf_state)
    for name, tensor in hf_state.items():
        assert torch.equal(merged[name], tensor), name


def test_tied_embeddings_round_trip() -> None:
    hf_state, config = _qwen2_state(tie=True)
    layout = GPTLayout.from_hf_config(config, tp_size=2, vocab_multiple=8)
    assert layout.tied_embeddings
    shards = hf_to_megatron(hf_state, layout, tp_size=2)
    assert "output_layer.weight" not in shards[0]  # one stage: the output layer reuses the embedding
    back = megatron_to_hf(shards, layout)
    for name, tensor in hf_state.items():
        assert torch.equal(back[name], tensor), name
    # Two stages: the last holds its own copy of the embedding as the output layer.
    last = hf_to_megatron(hf_state, layout, tp_size=2, pp_size=2, pp_rank=1)
    full = torch.cat([s["output_layer.weight"] for s in last])[:100]
    assert torch.equal(full, hf_state["model.embed_tokens.weight"])


def test_fused_norm_names_for_transformer_engine_spec(qwen2: tuple[dict[str, torch.Tensor], Any]) -> None:
    hf_state, config = qwen2
    layout = GPTLayout.from_hf_config(config, fused_norms=True)
    shard0 = hf_to_megatron(hf_state, layout)[0]
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in shard0
    assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in shard0
    assert "decoder.layers.0.input_layernorm.weight" not in shard0
    back = megatron_to_hf([shard0], layout)
    assert torch.equal(
        back["model.layers.1.post_attention_layernorm.weight"],
        hf_state["model.layers.1.post_attention_layernorm.weight"],
    )


def test_impossible_split_and_missing_tensor_raise(qwen2: tuple[dict[str, torch.Tensor], Any]) -> None:
    hf_state, config = qwen2
    layout = GPTLayout.from_hf_config(config, tp_size=4)
    with pytest.raises(ConfigError, match="num_key_value_heads=2 is not divisible by tp=4"):
        hf_to_megatron(hf_state, layout, tp_size=4)
    partial = {k: v for k, v in hf_state.items() if "q_proj.weight" not in k}
    with pytest.raises(ConfigError, match=r"q_proj\.weight"):
        hf_to_megatron(partial, GPTLayout.from_hf_config(config))
