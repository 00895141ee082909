"""The Batch column names that worker roles read and write, defined once.

Axis letters: B batch (rows), T tokens, K top-k. Sequences use the padded layout of
:data:`roll.workers.types.MicroBatch`: ``input_ids_BT`` / ``attention_mask_BT`` hold prompt + response (left- or
right-padded), ``response_mask_BT`` marks the response tokens the loss looks at.

Inputs a role reads:

- ``generate``: :data:`PROMPT_IDS` (non-tensor, one ``list[int]`` per row) or left-padded :data:`INPUT_IDS` +
  :data:`ATTENTION_MASK`; optional :data:`PROMPT_INDEX` (else the row number).
- ``compute_logprobs`` / ``compute_values`` / ``score`` / ``topk_logits``: :data:`INPUT_IDS` + :data:`ATTENTION_MASK`.
- ``train_step``: whatever the pipeline's ``LossFn`` reads; :data:`INPUT_IDS` and :data:`ATTENTION_MASK` always.
  Tensor columns are passed to the loss under their Batch names, plus ``input_ids`` / ``attention_mask`` (the
  strategy's names).

Outputs are listed by the method that writes them in :mod:`roll.workers.roles`.
"""

from __future__ import annotations

from typing import Final

INPUT_IDS: Final = "input_ids_BT"
ATTENTION_MASK: Final = "attention_mask_BT"
RESPONSE_MASK: Final = "response_mask_BT"
POSITION_IDS: Final = "position_ids_BT"

LOGP: Final = "logp_BT"
"""Log-probs recomputed by a forward pass (``compute_logprobs``), aligned as in :mod:`roll.workers.types`."""
ENTROPY: Final = "entropy_BT"
INFER_LOGP: Final = "infer_logp_BT"
"""Log-probs the inference worker reported while sampling, aligned like :data:`LOGP` (0 outside the response)."""
VALUES: Final = "values_BT"
SCORES: Final = "scores_B"
TOPK_VALUES: Final = "topk_values_BTK"
"""Teacher logits of the ``k`` most likely next tokens at each position (raw logits, float32, descending)."""
TOPK_INDICES: Final = "topk_indices_BTK"

PROMPT_IDS: Final = "prompt_ids"
"""Non-tensor: the prompt's token ids as ``list[int]``."""
PROMPT_INDEX: Final = "prompt_index_B"
SAMPLE_INDEX: Final = "sample_index_B"
"""Which of the ``n`` samples of its prompt a generated row is (0..n-1)."""
SAMPLE_ID: Final = "sample_id_B"
"""A globally unique row id; logits transfer matches teacher rows to student rows by it."""
RESPONSE_IDS: Final = "response_ids"
"""Non-tensor: the generated token ids as ``list[int]`` (including the stop token that ended the sample)."""
RESPONSE_LOGP: Final = "response_logp"
"""Non-tensor: ``list[float]``, the log-prob of each generated token (see ``GeneratedSample``)."""
FINISH_REASON: Final = "finish_reason"
"""Non-tensor: ``"stop"`` or ``"length"``."""
TEXT: Final = "text"
"""Non-tensor: decoded response (``None`` without a tokenizer)."""
POLICY_VERSION: Final = "policy_version_B"
"""int64: the policy version of the weights that produced each generated row."""

__all__ = [
    "ATTENTION_MASK",
    "ENTROPY",
    "FINISH_REASON",
    "INFER_LOGP",
    "INPUT_IDS",
    "LOGP",
    "POLICY_VERSION",
    "POSITION_IDS",
    "PROMPT_IDS",
    "PROMPT_INDEX",
    "RESPONSE_IDS",
    "RESPONSE_LOGP",
    "RESPONSE_MASK",
    "SAMPLE_ID",
    "SAMPLE_INDEX",
    "SCORES",
    "TEXT",
    "TOPK_INDICES",
    "TOPK_VALUES",
    "VALUES",
]
