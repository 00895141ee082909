"""Masked reductions and the four loss-aggregation modes.

A per-token loss ``loss_BT`` becomes a scalar in one of four ways (``mask_BT`` is 1 on trained tokens):

- ``token-mean``: ``sum(loss * mask) / N_tokens``. Every token weighs the same, so long answers weigh more
  (DAPO's token-level loss). With data-parallel micro-batches, pass ``num_global_tokens`` = the number of
  trained tokens in the whole optimizer step; then the micro-batch losses *sum* to the exact global mean and
  gradients only need to be summed (not averaged) across micro-batches and ranks.
- ``seq-mean-token-sum``: ``mean_b sum_t(loss * mask)``: each sequence's summed loss, averaged over sequences.
- ``seq-mean-token-mean``: ``mean_b [sum_t(loss * mask) / sum_t mask]``: the original GRPO objective
  (Shao et al. 2024, eq. 3): each sequence weighs the same whatever its length.
- ``seq-mean-token-sum-norm``: ``mean_b [sum_t(loss * mask) / L]`` with a constant ``L``: Dr. GRPO (Liu et al.
  2025, "Understanding R1-Zero-Like Training") removes the length bias by dividing by a constant, the
  generation budget, rather than by each response's own length. ``norm_len`` is required: the padded width of
  a micro-batch changes under dynamic batching, so it is not a constant.

The ``seq-mean-*`` modes take ``num_global_seqs`` for the same reason ``token-mean`` takes
``num_global_tokens``: with it, micro-batch losses sum to the global mean over sequences.

A sequence with no trained token (an overlong-filtered sample, whose mask was zeroed) still counts as a sequence
and contributes zero, as in the GRPO formula's ``1/G`` over the sampled group. verl (2026) now leaves such rows out
of the count; roll keeps them so that the normalizer is the number of sampled sequences, fixed before any filter
ran: filtering a sample then removes its gradient without scaling up the others', and the unit count of a
micro-batch (its rows) is known without reading its mask. ``seq-mean-token-sum-norm`` is a mean over sequences
here; verl's is the plain sum over sequences divided by ``L``, ``B`` times roll's (same direction, a constant
factor for a fixed batch size). docs/algorithms.md lists these conventions.

A *sequence* need not be one row. When a chat template splits an agentic trajectory into ``k`` segment rows
(docs/chat-templates.md), the ``seq-mean-*`` modes must still weigh it as one sequence, exactly as its tokens
would weigh unsplit. Two per-row tensors say so (``seq_units_B``, ``seq_tokens_B``; the batch columns
:data:`~roll.core.columns.SEQ_UNITS` and :data:`~roll.core.columns.SEQ_TOKENS`): a row is ``seq_units_B``
(``1/k``) of a sequence, and ``seq-mean-token-mean`` divides its token sum by its *sequence's* trained tokens
``seq_tokens_B`` (the trajectory's, over all its segments) instead of its own. Then, for a trajectory of
segments ``s`` with token sums ``S_s`` and trained tokens ``n_s``::

    token-sum:   sum_s S_s           = S           (its unsplit row's token sum; 1 unit: sum_s 1/k)
    token-mean:  sum_s S_s / sum_s n_s = S / n     (its unsplit row's token mean; 1 unit)
    sum-norm:    sum_s S_s / L       = S / L

so the loss equals the unsplit batch's, whatever micro-batch or rank each segment lands on (the numerators are
per row, the units add up globally). Without them every row is its own sequence, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from roll.core.errors import ConfigError
from roll.pipelines.algorithms.choices import LOSS_AGG_MODES, LossAggMode


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``sum(x * mask)`` over ``dim`` (all dims when None). ``mask`` is bool or 0/1 float, broadcastable."""
    masked = x * mask.to(x.dtype)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` where ``mask`` is set; 0 (not NaN) when the mask is empty."""
    count = masked_sum(torch.ones_like(x), mask, dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max of ``x`` where ``mask`` is set; 0 when the mask is empty."""
    keep = mask.bool()
    if not bool(keep.any()):
        return x.new_zeros(())
    return x[keep].max()


def masked_var(x: torch.Tensor, mask: torch.Tensor, *, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries of ``x`` (Bessel-corrected when ``unbiased``, as verl/TRL do)."""
    mean = masked_mean(x, mask)
    count = masked_sum(torch.ones_like(x), mask)
    var = masked_sum((x - mean) ** 2, mask) / count.clamp(min=1)
    if unbiased:
        var = var * count / (count - 1).clamp(min=1)
    return var


def aggregate_loss(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    mode: LossAggMode = "token-mean",
    num_global_tokens: int | float | torch.Tensor | None = None,
    num_global_seqs: int | float | torch.Tensor | None = None,
    norm_len: int | None = None,
    seq_units_B: torch.Tensor | None = None,
    seq_tokens_B: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar by ``mode`` (see the module docstring for each formula).

    ``num_global_tokens`` (token-mean) and ``num_global_seqs`` (seq-mean-*) replace the local counts in the
    denominators, so that micro-batches of one optimizer step sum to the full-batch value. ``norm_len`` is the
    constant length of ``seq-mean-token-sum-norm`` (Dr. GRPO). ``seq_units_B`` and ``seq_tokens_B`` (seq-mean-*
    only) make several rows one sequence (module docstring); the local sequence count is then
    ``seq_units_B.sum()``.
    """
    mask = mask_BT.to(loss_BT.dtype)
    if mode == "token-mean":
        n_tokens = mask.sum() if num_global_tokens is None else num_global_tokens
        return (loss_BT * mask).sum() / torch.as_tensor(n_tokens, dtype=loss_BT.dtype).clamp(min=1)
    seq_sum_B = (loss_BT * mask).sum(dim=-1)
    if mode == "seq-mean-token-sum":
        per_seq_B = seq_sum_B
    elif mode == "seq-mean-token-mean":
        tokens_B = mask.sum(dim=-1) if seq_tokens_B is None else seq_tokens_B.to(mask)
        per_seq_B = seq_sum_B / tokens_B.clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        if norm_len is None or norm_len <= 0:
            raise ConfigError(
                f"loss aggregation 'seq-mean-token-sum-norm' needs a positive constant norm_len, got {norm_len!r}; "
                "pass the generation budget (max new tokens)"
            )
        per_seq_B = seq_sum_B / norm_len
    else:
        raise ConfigError(f"unknown loss aggregation mode {mode!r}; known: {', '.join(LOSS_AGG_MODES)}")
    n_seqs = num_global_seqs
    if n_seqs is None:
        n_seqs = per_seq_B.new_tensor(per_seq_B.shape[0]) if seq_units_B is None else seq_units_B.sum()
    return per_seq_B.sum() / torch.as_tensor(n_seqs, dtype=loss_BT.dtype).clamp(min=1)


@dataclass(frozen=True)
class Aggregation:
    """An aggregation mode bound to its global counts; losses take one as ``agg=`` and call it.

    Build one per micro-batch: ``Aggregation("token-mean", num_global_tokens=n)``. The default instance is a
    local token-mean. :meth:`for_rows` binds a micro-batch's ``seq_units_B`` / ``seq_tokens_B``.
    """

    mode: LossAggMode = "token-mean"
    num_global_tokens: int | float | torch.Tensor | None = None
    num_global_seqs: int | float | torch.Tensor | None = None
    norm_len: int | None = None
    seq_units_B: torch.Tensor | None = None
    seq_tokens_B: torch.Tensor | None = None

    def for_rows(self, seq_units_B: torch.Tensor | None, seq_tokens_B: torch.Tensor | None) -> Aggregation:
        """This aggregation over rows that are parts of sequences (module docstring); itself when both are
        None, so an unsplit batch aggregates exactly as before."""
        if seq_units_B is None and seq_tokens_B is None:
            return self
        return replace(self, seq_units_B=seq_units_B, seq_tokens_B=seq_tokens_B)

    def __call__(self, loss_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(
            loss_BT,
            mask_BT,
            mode=self.mode,
            num_global_tokens=self.num_global_tokens,
            num_global_seqs=self.num_global_seqs,
            norm_len=self.norm_len,
            seq_units_B=self.seq_units_B,
            seq_tokens_B=self.seq_tokens_B,
        )


TOKEN_MEAN = Aggregation()
