"""What the megatron strategy computes from the last pipeline stage's output: one reader per model head.

A role that trains a model with a head of its own (a critic's value head, a reward model's score head, a distilled
student that needs its logits) passes the strategy a :class:`ForwardPair`: the transformers ``forward`` the fsdp2
strategy runs (the pair is called like it) and the :class:`MegatronHead` the megatron strategy uses. So a role
builds either backend through the same ``forward=`` argument, and the backends stay unaware of the roles.

A :class:`MegatronHead` says which last layer the ``GPTModel`` gets (``kind``: the vocabulary-parallel LM output
layer, or a one-output linear that replaces it, ``value`` with a bias as ``AutoModelForTokenClassification`` has,
``score`` without one as ``AutoModelForSequenceClassification``) and how a micro-batch's output becomes the
:class:`~roll.workers.types.ForwardOutput` the loss receives (``read``).

Rows reach the model left-aligned (each row's valid span starts at column 0, :func:`align_left`), so Megatron's
causal mask is exact; the readers move results back to the micro-batch's own layout (:func:`restore_layout`).
Everything here but :func:`vocab_parallel_scores` and :func:`gather_vocab` is plain torch, tested on CPU; those two
import Megatron's TP collectives when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

from roll.core.errors import ConfigError
from roll.workers.types import ForwardOutput

HeadKind = Literal["lm", "value", "score"]


# ---- layout of one micro-batch ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Aligned:
    """A micro-batch with each row's valid span moved to column 0 (``start_B`` remembers the shift)."""

    ids_BT: torch.Tensor
    start_B: torch.Tensor
    mask_BT: torch.Tensor


def align_left(ids_BT: torch.Tensor, mask_BT: torch.Tensor) -> Aligned:
    """Shift each row so its first valid token sits at column 0 (valid tokens must be contiguous)."""
    T = ids_BT.shape[1]
    valid_BT = mask_BT.bool()
    start_B = torch.where(
        valid_BT.any(1), valid_BT.int().argmax(1), torch.zeros_like(valid_BT[:, 0], dtype=torch.long)
    )
    cols_BT = torch.arange(T, device=ids_BT.device)[None] + start_B[:, None]
    return Aligned(ids_BT=ids_BT.gather(1, cols_BT.clamp(max=T - 1)), start_B=start_B, mask_BT=valid_BT)


def restore_layout(x_BT: torch.Tensor, aligned: Aligned) -> torch.Tensor:
    """Inverse of :func:`align_left` for per-token values ``[B, T]`` or ``[B, T, ...]``; zero outside the original
    valid positions."""
    B, T = x_BT.shape[:2]
    cols_BT = (torch.arange(T, device=x_BT.device)[None] - aligned.start_B[:, None]).clamp(min=0)
    tail = x_BT.shape[2:]
    index = cols_BT.reshape(B, T, *([1] * len(tail))).expand(B, T, *tail)
    keep = aligned.mask_BT.reshape(B, T, *([1] * len(tail)))
    return x_BT.gather(1, index) * keep


def to_token_positions(next_BT: torch.Tensor, aligned: Aligned) -> torch.Tensor:
    """Values about the *next* token at aligned ``t`` -> values about token ``t`` at ``t``, in the original layout
    (``[B, T]`` or ``[B, T, ...]``). Aligned column 0 is each row's first token: nothing predicts it, so it gets 0."""
    shifted = torch.cat([torch.zeros_like(next_BT[:, :1]), next_BT[:, :-1]], dim=1)
    return restore_layout(shifted, aligned)


# ---- the heads -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageOutput:
    """One micro-batch's output on the last pipeline stage, in the aligned layout.

    ``output_BTX``: this TP rank's vocabulary slice of the logits (``lm``) or the head's ``[B, T, 1]`` (``value``,
    ``score``). ``vocab_size`` is the real vocabulary (the output layer's is padded to a multiple of the TP size).
    """

    output_BTX: torch.Tensor
    aligned: Aligned
    vocab_size: int


Reader = Callable[[StageOutput, float, bool], ForwardOutput]
"""``read(stage, temperature, with_entropy) -> ForwardOutput`` for one micro-batch."""


@dataclass(frozen=True)
class MegatronHead:
    """The megatron strategy's view of a model head: its last layer (``kind``) and its :data:`Reader`."""

    kind: HeadKind
    read: Reader


@dataclass(frozen=True)
class ForwardPair:
    """A custom forward for both train backends: called like ``hf`` (fsdp2's ``forward=``), and ``megatron``."""

    hf: Callable[..., ForwardOutput]
    megatron: MegatronHead

    def __call__(self, *args: Any, **kwargs: Any) -> ForwardOutput:
        return self.hf(*args, **kwargs)


def read_logprobs(stage: StageOutput, temperature: float, with_entropy: bool) -> ForwardOutput:
    """A causal LM's ``logp_BT`` (and ``entropy_BT``) from vocabulary-parallel logits."""
    logp, ent = vocab_parallel_scores(
        stage.output_BTX, stage.aligned, stage.vocab_size, temperature=temperature, with_entropy=with_entropy
    )
    return ForwardOutput(logp_BT=logp, entropy_BT=ent)


def read_values(stage: StageOutput, temperature: float, with_entropy: bool) -> ForwardOutput:
    """A critic's ``values_BT``: the head's output at every position, 0 on padding (as ``value_forward``)."""
    values_BT = restore_layout(stage.output_BTX[..., 0].float(), stage.aligned)
    return ForwardOutput(logp_BT=values_BT.new_zeros(values_BT.shape[0], 0), values_BT=values_BT)


def read_scores(stage: StageOutput, temperature: float, with_entropy: bool) -> ForwardOutput:
    """A reward model's ``scores_B``: the head's output at each row's last valid token (as ``score_forward``).

    Aligned, a row's last valid token sits at column ``length - 1``; a row without tokens scores column 0."""
    per_token_BT = stage.output_BTX[..., 0].float()
    last_B = (stage.aligned.mask_BT.sum(-1) - 1).clamp(min=0)
    scores_B = per_token_BT[torch.arange(per_token_BT.shape[0], device=per_token_BT.device), last_B]
    return ForwardOutput(logp_BT=scores_B.new_zeros(scores_B.shape[0], 0), scores_B=scores_B)


LM_HEAD = MegatronHead("lm", read_logprobs)
VALUE_HEAD = MegatronHead("value", read_values)
SCORE_HEAD = MegatronHead("score", read_scores)


def head_of(forward: Callable[..., ForwardOutput] | None) -> MegatronHead:
    """The :class:`MegatronHead` a strategy built with ``forward=`` uses; a bare transformers forward has none."""
    if forward is None:
        return LM_HEAD
    if isinstance(forward, ForwardPair):
        return forward.megatron
    name = getattr(forward, "__name__", type(forward).__name__)
    raise ConfigError(
        f"the megatron strategy cannot run the transformers forward {name!r}: pass a "
        "roll.workers.megatron_heads.ForwardPair that also names its MegatronHead, or use strategy.type fsdp2"
    )


def token_logits(
    stage: StageOutput, gather: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """Full-vocabulary logits ``[B, T, V]`` aligned like the log-probs: ``[b, t]`` is the distribution of token
    ``t`` (row 0 and padding are zeros). ``gather`` joins the TP ranks' vocabulary slices (default:
    :func:`gather_vocab`; identity at TP 1); the padded vocabulary columns are dropped."""
    full_BTV = (gather or gather_vocab)(stage.output_BTX)[..., : stage.vocab_size]
    return to_token_positions(full_BTV, stage.aligned)


def gather_vocab(logits_BTv: torch.Tensor) -> torch.Tensor:
    """Concatenate the TP ranks' vocabulary slices (autograd-aware: each rank keeps its slice's gradient)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return logits_BTv
    gathered: torch.Tensor = gather_from_tensor_model_parallel_region(logits_BTv)
    return gathered


# ---- scores from vocabulary-parallel logits ------------------------------------------------------------------


def vocab_parallel_scores(
    logits_BTv: torch.Tensor, aligned: Aligned, vocab_size: int, *, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logp_BT`` (and ``entropy_BT``) in the original layout from this TP rank's slice of the logits.

    Position ``t`` scores token ``t`` with the logits at ``t - 1`` (the repo-wide convention); the first token and
    padding get 0. The sums over the vocabulary are all-reduced with Megatron's autograd-aware
    ``reduce_from_tensor_model_parallel_region``; the max is a constant for autograd.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region as tp_sum

    v_local = logits_BTv.shape[-1]
    start = parallel_state.get_tensor_model_parallel_rank() * v_local
    x = logits_BTv.float() / temperature
    real_v = torch.arange(start, start + v_local, device=x.device) < vocab_size
    x = x.masked_fill(~real_v, float("-inf"))
    m = x.detach().max(-1, keepdim=True).values
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=parallel_state.get_tensor_model_parallel_group())
    z = x - m
    sum_exp = tp_sum(z.exp().sum(-1))
    labels_BT = torch.roll(aligned.ids_BT, shifts=-1, dims=1) - start
    here = (labels_BT >= 0) & (labels_BT < v_local)
    gathered = z.gather(-1, labels_BT.clamp(0, v_local - 1)[..., None]).squeeze(-1)
    picked = torch.where(here, gathered, torch.zeros_like(gathered))  # where, not *: gathered may be -inf
    logp_next = tp_sum(picked) - sum_exp.log()
    ent_next = None
    if with_entropy:
        p_z = torch.where(real_v, z.exp() * z, torch.zeros_like(z)).sum(-1)
        ent_next = sum_exp.log() - tp_sum(p_z) / sum_exp
    logp = to_token_positions(logp_next, aligned)
    return logp, (to_token_positions(ent_next, aligned) if ent_next is not None else None)


class ScalarHead(torch.nn.Module):
    """The one-output linear that replaces ``GPTModel.output_layer`` for a value or score head.

    Replicated on every TP rank (its input, the final norm's output, is the full hidden state there), called as
    Megatron calls its output layer (``layer(hidden, weight=..., runtime_gather_output=...) -> (out, bias)``), and
    named ``output_layer.weight`` / ``output_layer.bias`` (see :mod:`roll.workers.megatron_convert`).
    """

    sequence_parallel = False  # read by GPTModel's inference path; this head never runs sequence-parallel

    def __init__(self, hidden_size: int, *, bias: bool, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype, device=device))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=dtype, device=device)) if bias else None

    def forward(self, hidden_states: torch.Tensor, **_: Any) -> tuple[torch.Tensor, None]:
        return torch.nn.functional.linear(hidden_states, self.weight, self.bias), None


__all__ = [
    "LM_HEAD",
    "SCORE_HEAD",
    "VALUE_HEAD",
    "Aligned",
    "ForwardPair",
    "HeadKind",
    "MegatronHead",
    "Reader",
    "ScalarHead",
    "StageOutput",
    "align_left",
    "gather_vocab",
    "head_of",
    "read_logprobs",
    "read_scores",
    "read_values",
    "restore_layout",
    "to_token_positions",
    "token_logits",
    "vocab_parallel_scores",
]
