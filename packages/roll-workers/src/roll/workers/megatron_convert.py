"""HF <-> Megatron-Core weight layout for Qwen2/Llama-family decoders: pure torch, no Megatron import.

Why a module of its own: the name mapping and the tensor surgery are the part of the Megatron strategy most likely
to be subtly wrong, and they need no GPU, so they are tested on CPU by exact round trips.

Layout facts (Megatron-Core ``GPTModel`` with the local or Transformer-Engine layer spec):

- **qkv fusion.** ``self_attention.linear_qkv`` holds q, k and v grouped by key/value head ("query group"): for
  each of the ``G = num_kv_heads`` groups, its ``H / G`` query heads, then its key head, then its value head, each
  ``head_dim`` rows. The bias (Qwen2 ``add_qkv_bias``) follows the same row order.
- **gate/up fusion.** ``mlp.linear_fc1`` of a gated MLP (SwiGLU) computes ``[gate; up]`` on *each tensor-parallel
  rank*: Megatron chunks the rank-local output in two. So rank ``r`` holds ``cat(gate_r, up_r)``; the full fused
  weight is not a contiguous split of ``cat(gate, up)``.
- **TP sharding.** Column-parallel (output rows split): ``linear_qkv`` (whole query groups per rank, since the
  fused rows are group-major), ``linear_fc1`` (per the rule above), ``word_embeddings`` and ``output_layer``
  (vocabulary rows). Row-parallel (input columns split): ``linear_proj``, ``linear_fc2``. Norms are replicated.
- **Vocabulary padding.** Megatron splits the vocabulary evenly over TP ranks, so embeddings and the output layer
  are padded with zero rows up to ``padded_vocab_size``; the export drops them again.
- **Pipeline stages** number their layers locally from 0; the first stage holds the embedding, the last the final
  norm and the output layer. With tied embeddings and more than one stage the last stage holds its own copy of the
  embedding as ``output_layer.weight`` (Megatron keeps the two in sync).
- **Heads.** A causal LM ends in ``output_layer`` (vocabulary-parallel, above). A value head (critic,
  ``AutoModelForTokenClassification``: ``score.weight`` ``[1, H]`` and ``score.bias``) or a score head (reward model,
  ``AutoModelForSequenceClassification``: ``score.weight`` only) replaces it with a one-output linear, replicated
  on every TP rank, named ``output_layer.weight`` / ``output_layer.bias``
  (:class:`roll.workers.megatron_heads.ScalarHead`); such models have no ``lm_head`` and never tie embeddings.
- **Norm placement.** The local spec has ``input_layernorm``/``pre_mlp_layernorm`` modules; the TE spec fuses them
  into the following linear as ``layer_norm_weight`` (``fused_norms=True``).

RoPE needs no permutation: HF Llama/Qwen2 and Megatron (``rotary_interleaved=False``) both rotate halves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from roll.core.errors import ConfigError

Split = Literal["replicated", "column", "row"]
Head = Literal["lm", "value", "score"]

HEAD_TENSORS: dict[Head, tuple[tuple[str, str], ...]] = {
    "lm": (("lm_head.weight", "output_layer.weight"),),
    "value": (("score.weight", "output_layer.weight"), ("score.bias", "output_layer.bias")),
    "score": (("score.weight", "output_layer.weight"),),
}
"""(HF name, Megatron name) of each tensor of a head on the last pipeline stage."""


@dataclass(frozen=True)
class GPTLayout:
    """The shape facts the conversion needs, read once from an HF config."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    qk_layernorm: bool = False
    fused_norms: bool = False
    head: Head = "lm"

    @classmethod
    def from_hf_config(
        cls,
        config: Any,
        *,
        tp_size: int = 1,
        vocab_multiple: int = 128,
        fused_norms: bool = False,
        head: Head = "lm",
    ) -> GPTLayout:
        """Read a transformers ``Qwen2Config``/``LlamaConfig``/``Qwen3Config`` (duck-typed).

        ``padded_vocab_size`` rounds the vocabulary up to a multiple of ``vocab_multiple * tp_size`` (Megatron's
        ``make_vocab_size_divisible_by`` rule). Qwen2 always has a qkv bias; Llama has one when
        ``attention_bias``; Qwen3 has q/k norms and no bias. ``head`` is the model's last layer (module docstring);
        only an ``lm`` head can be tied to the embedding.
        """
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        model_type = str(getattr(config, "model_type", ""))
        step = vocab_multiple * tp_size
        vocab = int(config.vocab_size)
        return cls(
            num_layers=int(config.num_hidden_layers),
            hidden_size=int(config.hidden_size),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            ffn_hidden_size=int(config.intermediate_size),
            vocab_size=vocab,
            padded_vocab_size=math.ceil(vocab / step) * step,
            tied_embeddings=head == "lm" and bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
            qk_layernorm=model_type == "qwen3",
            fused_norms=fused_norms,
            head=head,
        )

    def check_parallel(self, tp_size: int, pp_size: int) -> None:
        """Raise :class:`ConfigError` when the model cannot be split ``tp_size`` x ``pp_size`` ways."""
        problems = []
        if self.num_kv_heads % tp_size:
            problems.append(f"num_key_value_heads={self.num_kv_heads} is not divisible by tp={tp_size}")
        if self.ffn_hidden_size % tp_size:
            problems.append(f"intermediate_size={self.ffn_hidden_size} is not divisible by tp={tp_size}")
        if self.padded_vocab_size % tp_size:
            problems.append(f"padded vocab {self.padded_vocab_size} is not divisible by tp={tp_size}")
        if self.num_layers % pp_size:
            problems.append(f"num_hidden_layers={self.num_layers} is not divisible by pp={pp_size}")
        if problems:
            raise ConfigError("cannot split the model: " + "; ".join(problems))


# ---- tensor surgery ------------------------------------------------------------------------------------------


def interleave_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, num_kv_heads: int
) -> torch.Tensor:
    """Fuse HF ``q_proj``/``k_proj``/``v_proj`` rows (weights ``[rows, in]`` or biases ``[rows]``) into Megatron's
    group-major ``linear_qkv`` order: per query group, its ``H/G`` query heads, its key head, its value head."""
    groups = num_kv_heads
    tail = q.shape[1:]
    q_g = q.reshape(groups, -1, *tail)  # [G, H/G * d, ...]
    k_g = k.reshape(groups, -1, *tail)  # [G, d, ...]
    v_g = v.reshape(groups, -1, *tail)  # [G, d, ...]
    if q_g.shape[1] != (num_heads // num_kv_heads) * k_g.shape[1]:
        raise ConfigError(
            f"q rows {q.shape[0]} do not match {num_heads} heads over {num_kv_heads} kv heads of k rows "
            f"{k.shape[0]}"
        )
    return torch.cat([q_g, k_g, v_g], dim=1).reshape(-1, *tail)


def split_qkv(
    qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`interleave_qkv`; also works on one TP shard (pass that shard's head counts)."""
    per_group = num_heads // num_kv_heads
    tail = qkv.shape[1:]
    grouped = qkv.reshape(num_kv_heads, (per_group + 2) * head_dim, *tail)
    q_g, k_g, v_g = torch.split(grouped, [per_group * head_dim, head_dim, head_dim], dim=1)
    return q_g.reshape(-1, *tail), k_g.reshape(-1, *tail), v_g.reshape(-1, *tail)


def shard(tensor: torch.Tensor, tp_size: int, split: Split) -> list[torch.Tensor]:
    """The ``tp_size`` TP shards of a full tensor: rows for column-parallel, columns for row-parallel."""
    if split == "replicated" or tp_size == 1:
        return [tensor] * tp_size
    dim = 0 if split == "column" else 1
    if tensor.shape[dim] % tp_size:
        raise ConfigError(f"dimension {dim} of shape {tuple(tensor.shape)} is not divisible by tp={tp_size}")
    return [t.clone() for t in torch.chunk(tensor, tp_size, dim=dim)]


def unshard(shards: Sequence[torch.Tensor], split: Split) -> torch.Tensor:
    """Inverse of :func:`shard` (replicated tensors come from rank 0)."""
    if split == "replicated" or len(shards) == 1:
        return shards[0]
    return torch.cat(list(shards), dim=0 if split == "column" else 1)


def shard_fc1(gate: torch.Tensor, up: torch.Tensor, tp_size: int) -> list[torch.Tensor]:
    """``linear_fc1`` of each TP rank: ``cat(gate_r, up_r)`` (Megatron chunks the rank-local output in two)."""
    gates, ups = shard(gate, tp_size, "column"), shard(up, tp_size, "column")
    return [torch.cat([g, u], dim=0) for g, u in zip(gates, ups)]


def unshard_fc1(shards: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`shard_fc1`: the full ``gate_proj`` and ``up_proj``."""
    halves = [torch.chunk(s, 2, dim=0) for s in shards]
    return torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])


def pad_vocab(weight: torch.Tensor, padded_rows: int) -> torch.Tensor:
    """Append zero rows up to ``padded_rows`` (embeddings and output layer)."""
    extra = padded_rows - weight.shape[0]
    if extra < 0:
        raise ConfigError(f"padded vocab {padded_rows} is smaller than the vocab {weight.shape[0]}")
    return torch.cat([weight, weight.new_zeros(extra, *weight.shape[1:])]) if extra else weight


# ---- names -----------------------------------------------------------------------------------------------------


def layer_range(num_layers: int, pp_size: int, pp_rank: int) -> range:
    """Global indices of the layers of pipeline stage ``pp_rank`` (even split)."""
    if num_layers % pp_size:
        raise ConfigError(f"num_hidden_layers={num_layers} is not divisible by pp={pp_size}")
    per_stage = num_layers // pp_size
    return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)


def _simple_layer_params(layout: GPTLayout) -> list[tuple[str, str, Split]]:
    """(HF suffix, Megatron suffix, split) of each per-layer tensor that maps one to one."""
    in_norm = (
        "self_attention.linear_qkv.layer_norm_weight" if layout.fused_norms else "input_layernorm.weight"
    )
    mlp_norm = "mlp.linear_fc1.layer_norm_weight" if layout.fused_norms else "pre_mlp_layernorm.weight"
    params: list[tuple[str, str, Split]] = [
        ("input_layernorm.weight", in_norm, "replicated"),
        ("post_attention_layernorm.weight", mlp_norm, "replicated"),
        ("self_attn.o_proj.weight", "self_attention.linear_proj.weight", "row"),
        ("mlp.down_proj.weight", "mlp.linear_fc2.weight", "row"),
    ]
    if layout.qk_layernorm:
        params += [
            ("self_attn.q_norm.weight", "self_attention.q_layernorm.weight", "replicated"),
            ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight", "replicated"),
        ]
    return params


def _qkv_suffixes(layout: GPTLayout) -> list[str]:
    return ["weight", "bias"] if layout.qkv_bias else ["weight"]


def _has_output_layer(layout: GPTLayout, pp_size: int, pp_rank: int) -> bool:
    last = pp_rank == pp_size - 1
    return last and (not layout.tied_embeddings or pp_rank > 0)


# ---- HF -> Megatron ----------------------------------------------------------------------------------------------


def hf_to_megatron(
    hf_state: Mapping[str, torch.Tensor],
    layout: GPTLayout,
    *,
    tp_size: int = 1,
    pp_size: int = 1,
    pp_rank: int = 0,
) -> list[dict[str, torch.Tensor]]:
    """The Megatron ``GPTModel`` state dict of each TP rank of pipeline stage ``pp_rank``.

    ``hf_state`` uses transformers names (``model.layers.0.self_attn.q_proj.weight`` ...); missing tensors raise
    :class:`ConfigError` naming them. Layer indices in the result are local to the stage.
    """
    layout.check_parallel(tp_size, pp_size)
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(tp_size)]
    get = _getter(hf_state)
    if pp_rank == 0:
        emb = pad_vocab(get("model.embed_tokens.weight"), layout.padded_vocab_size)
        _put(out, "embedding.word_embeddings.weight", shard(emb, tp_size, "column"))
    for local, layer in enumerate(layer_range(layout.num_layers, pp_size, pp_rank)):
        _layer_to_megatron(out, get, layout, tp_size, f"model.layers.{layer}.", f"decoder.layers.{local}.")
    if pp_rank == pp_size - 1:
        _put(out, "decoder.final_layernorm.weight", [get("model.norm.weight")] * tp_size)
    if _has_output_layer(layout, pp_size, pp_rank):
        _head_to_megatron(out, get, layout, tp_size)
    return out


def _head_to_megatron(out: list[dict[str, torch.Tensor]], get: Any, layout: GPTLayout, tp_size: int) -> None:
    if layout.head != "lm":  # a one-output linear, replicated on every TP rank
        for hf_name, mg_name in HEAD_TENSORS[layout.head]:
            _put(out, mg_name, [get(hf_name)] * tp_size)
        return
    head = "model.embed_tokens.weight" if layout.tied_embeddings else "lm_head.weight"
    _put(out, "output_layer.weight", shard(pad_vocab(get(head), layout.padded_vocab_size), tp_size, "column"))


def _layer_to_megatron(
    out: list[dict[str, torch.Tensor]], get: Any, layout: GPTLayout, tp_size: int, hf: str, mg: str
) -> None:
    for hf_suffix, mg_suffix, split in _simple_layer_params(layout):
        _put(out, mg + mg_suffix, shard(get(hf + hf_suffix), tp_size, split))
    for kind in _qkv_suffixes(layout):
        q, k, v = (get(f"{hf}self_attn.{name}_proj.{kind}") for name in "qkv")
        fused = interleave_qkv(q, k, v, layout.num_heads, layout.num_kv_heads)
        _put(out, f"{mg}self_attention.linear_qkv.{kind}", shard(fused, tp_size, "column"))
    gate, up = get(hf + "mlp.gate_proj.weight"), get(hf + "mlp.up_proj.weight")
    _put(out, mg + "mlp.linear_fc1.weight", shard_fc1(gate, up, tp_size))


def _getter(state: Mapping[str, torch.Tensor]) -> Any:
    def get(name: str) -> torch.Tensor:
        if name not in state:
            raise ConfigError(
                f"the HF state dict has no tensor {name!r} (is this a Qwen2/Llama-family model?)"
            )
        return state[name]

    return get


def _put(out: list[dict[str, torch.Tensor]], name: str, shards: Sequence[torch.Tensor]) -> None:
    for rank, tensor in enumerate(shards):
        out[rank][name] = tensor


# ---- Megatron -> HF ----------------------------------------------------------------------------------------------


def megatron_to_hf(
    tp_states: Sequence[Mapping[str, torch.Tensor]],
    layout: GPTLayout,
    *,
    pp_size: int = 1,
    pp_rank: int = 0,
    include_tied_head: bool = True,
) -> dict[str, torch.Tensor]:
    """HF tensors of pipeline stage ``pp_rank`` from the state dicts of all its TP ranks (in rank order).

    Extra Megatron keys (``_extra_state`` of TE modules, rotary buffers) are ignored; vocabulary padding is dropped.
    With tied embeddings, ``lm_head.weight`` is emitted as the embedding when ``include_tied_head`` (transformers
    lists it in ``state_dict()``) and the stage holds the embedding.
    """
    get = _shard_getter(tp_states)
    hf: dict[str, torch.Tensor] = {}
    if pp_rank == 0:
        emb = unshard(get("embedding.word_embeddings.weight"), "column")[: layout.vocab_size]
        hf["model.embed_tokens.weight"] = emb
        if layout.tied_embeddings and include_tied_head:
            hf["lm_head.weight"] = emb
    for local, layer in enumerate(layer_range(layout.num_layers, pp_size, pp_rank)):
        hf.update(_layer_to_hf(get, layout, f"model.layers.{layer}.", f"decoder.layers.{local}."))
    if pp_rank == pp_size - 1:
        hf["model.norm.weight"] = get("decoder.final_layernorm.weight")[0]
        if layout.head != "lm":
            hf.update({hf_name: get(mg_name)[0] for hf_name, mg_name in HEAD_TENSORS[layout.head]})
        elif not layout.tied_embeddings:
            hf["lm_head.weight"] = unshard(get("output_layer.weight"), "column")[: layout.vocab_size]
    return hf


def _layer_to_hf(get: Any, layout: GPTLayout, hf: str, mg: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for hf_suffix, mg_suffix, split in _simple_layer_params(layout):
        out[hf + hf_suffix] = unshard(get(mg + mg_suffix), split)
    for kind in _qkv_suffixes(layout):
        shards = get(f"{mg}self_attention.linear_qkv.{kind}")
        tp_size = len(shards)
        parts = [
            split_qkv(s, layout.num_heads // tp_size, layout.num_kv_heads // tp_size, layout.head_dim)
            for s in shards
        ]
        for i, name in enumerate("qkv"):
            out[f"{hf}self_attn.{name}_proj.{kind}"] = torch.cat([p[i] for p in parts])
    gate, up = unshard_fc1(get(mg + "mlp.linear_fc1.weight"))
    out[hf + "mlp.gate_proj.weight"], out[hf + "mlp.up_proj.weight"] = gate, up
    return out


def _shard_getter(tp_states: Sequence[Mapping[str, torch.Tensor]]) -> Any:
    if not tp_states:
        raise ConfigError("megatron_to_hf needs the state dict of at least one TP rank")

    def get(name: str) -> list[torch.Tensor]:
        missing = [rank for rank, state in enumerate(tp_states) if name not in state]
        if missing:
            raise ConfigError(f"TP rank(s) {missing} have no tensor {name!r} in their Megatron state dict")
        return [state[name] for state in tp_states]

    return get
