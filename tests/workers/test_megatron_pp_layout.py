"""Pipeline parallelism (PP=2) layout on CPU, on plain tensors: which stage holds which layer, and which HF names
each stage's Megatron tensors map to (the embedding on the first stage, the final norm and the head on the last,
tied embeddings). A 4-layer tiny Qwen2 makes the local/global layer numbering visible (2 layers a stage)."""

from __future__ import annotations

import pytest
import torch

from roll.core.errors import ConfigError
from roll.workers.megatron_convert import (
    GPTLayout,
    hf_to_megatron,
    layer_range,
    megatron_to_hf,
)


def _state(tie: bool) -> tuple[dict[str, torch.Tensor], GPTLayout]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=tie,
    )  # fmt: skip
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in Qwen2ForCausalLM(config).state_dict().items()}
    return state, GPTLayout.from_hf_config(config, vocab_multiple=8)


def test_layers_go_to_stages_in_contiguous_halves() -> None:
    """4 layers over 2 stages: stage 0 holds 0, 1 and stage 1 holds 2, 3."""
    assert [list(layer_range(4, 2, r)) for r in range(2)] == [[0, 1], [2, 3]]
    with pytest.raises(ConfigError, match="num_hidden_layers=3 is not divisible by pp=2"):
        layer_range(3, 2, 0)


def test_two_stages_map_to_disjoint_hf_names_embedding_first_head_last() -> None:
    """Untied: stage 0 = embedding + layers 0-1, stage 1 = layers 2-3 + final norm + lm_head; the two exports are
    disjoint, together the whole model, bit for bit; stage 1's local layer 1 is HF layer 3."""
    state, layout = _state(tie=False)
    stages = [hf_to_megatron(state, layout, pp_size=2, pp_rank=r)[0] for r in range(2)]
    assert "embedding.word_embeddings.weight" in stages[0] and "output_layer.weight" not in stages[0]
    assert (
        "embedding.word_embeddings.weight" not in stages[1] and "decoder.final_layernorm.weight" in stages[1]
    )
    assert {k.split(".")[2] for k in stages[1] if k.startswith("decoder.layers.")} == {"0", "1"}
    assert torch.equal(
        stages[1]["decoder.layers.1.self_attention.linear_proj.weight"],
        state["model.layers.3.self_attn.o_proj.weight"],
    )
    exported = [megatron_to_hf([s], layout, pp_size=2, pp_rank=r) for r, s in enumerate(stages)]
    layers = [{int(k.split(".")[2]) for k in e if k.startswith("model.layers.")} for e in exported]
    assert layers == [{0, 1}, {2, 3}]
    assert "model.norm.weight" in exported[1] and "model.norm.weight" not in exported[0]
    assert not set(exported[0]) & set(exported[1])
    assert "model.embed_tokens.weight" in exported[0] and "lm_head.weight" in exported[1]
    assert {*exported[0], *exported[1]} == set(state)
    for name, tensor in {**exported[0], **exported[1]}.items():
        assert torch.equal(tensor, state[name]), name


def test_tied_embeddings_over_two_stages() -> None:
    """Tied: the last stage keeps its own copy of the embedding as ``output_layer.weight`` (Megatron syncs the
    two), but only stage 0 exports it: as ``model.embed_tokens.weight`` and (transformers lists it) ``lm_head``."""
    state, layout = _state(tie=True)
    assert layout.tied_embeddings
    first, last = (hf_to_megatron(state, layout, pp_size=2, pp_rank=r)[0] for r in range(2))
    assert torch.equal(last["output_layer.weight"][:100], state["model.embed_tokens.weight"])
    assert bool((last["output_layer.weight"][100:] == 0).all())  # vocab padding rows (100 -> 104)
    assert "output_layer.weight" not in first
    head_stage = megatron_to_hf([last], layout, pp_size=2, pp_rank=1)
    assert "lm_head.weight" not in head_stage and "model.embed_tokens.weight" not in head_stage
    embed_stage = megatron_to_hf([first], layout, pp_size=2, pp_rank=0)
    assert torch.equal(embed_stage["lm_head.weight"], state["model.embed_tokens.weight"])
    assert {*embed_stage, *head_stage} == set(state)
