"""Forward functions for models with a scalar head, plugged into the fsdp2 strategy (``forward=``).

- :func:`value_forward`: ``AutoModelForTokenClassification`` with one label gives a value per token
  (``values_BT``, 0 on padding), the critic's output.
- :func:`score_forward`: ``AutoModelForSequenceClassification`` with one label; the per-token scores of its
  ``score`` layer are captured by a forward hook and read at each row's *last valid token by attention mask*.
  transformers' own pooling finds that token by ``input_ids != pad_token_id``, which is wrong when the pad id
  occurs inside a sequence (pad == eos is common); the mask is always right, for left and right padding.

:data:`VALUE_FORWARD` and :data:`SCORE_FORWARD` pair each with the megatron strategy's reader of the same head
(:mod:`roll.workers.megatron_heads`), so the roles pass one ``forward=`` whichever train strategy they build.
"""

from __future__ import annotations

import torch

from roll.core.errors import WorkerError
from roll.workers.logprobs import position_ids_from_mask
from roll.workers.megatron_heads import SCORE_HEAD, VALUE_HEAD, ForwardPair
from roll.workers.types import ForwardOutput


def value_forward(
    model: torch.nn.Module,
    ids_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    with_entropy: bool,
    temperature: float,
) -> ForwardOutput:
    """``values_BT``: the token-classification logit of each position, zeroed on padding."""
    pos_BT = position_ids_from_mask(mask_BT)
    logits_BT1 = model(input_ids=ids_BT, attention_mask=mask_BT, position_ids=pos_BT).logits
    values_BT = logits_BT1[..., 0].float() * mask_BT
    return ForwardOutput(logp_BT=values_BT.new_zeros(ids_BT.shape[0], 0), values_BT=values_BT)


def score_forward(
    model: torch.nn.Module,
    ids_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    with_entropy: bool,
    temperature: float,
) -> ForwardOutput:
    """``scores_B``: the score head's output at each row's last token with ``attention_mask == 1``."""
    head = _score_head(model)
    captured: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        model(input_ids=ids_BT, attention_mask=mask_BT, position_ids=position_ids_from_mask(mask_BT))
    finally:
        handle.remove()
    per_token_BT = captured[-1][..., 0].float()
    cols_BT = torch.arange(ids_BT.shape[1], device=ids_BT.device).expand_as(ids_BT)
    last_B = (cols_BT * mask_BT.long()).argmax(-1)
    scores_B = per_token_BT[torch.arange(ids_BT.shape[0], device=ids_BT.device), last_B]
    return ForwardOutput(logp_BT=scores_B.new_zeros(ids_BT.shape[0], 0), scores_B=scores_B)


def _score_head(model: torch.nn.Module) -> torch.nn.Module:
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Module):
            return head
    raise WorkerError(
        f"{type(model).__name__} has no 'score' head; load it with AutoModelForSequenceClassification"
    )


VALUE_FORWARD = ForwardPair(hf=value_forward, megatron=VALUE_HEAD)
SCORE_FORWARD = ForwardPair(hf=score_forward, megatron=SCORE_HEAD)
