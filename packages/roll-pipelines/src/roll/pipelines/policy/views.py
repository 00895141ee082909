"""Views of a batch: what goes to a worker is only the columns it reads, and only the rows that move its gradient.

:func:`split_inert` and :func:`permutation` do tensor work: a driver runs them in the train actor
(``actor.apply``), which has torch loaded; this module imports torch only inside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from roll.core import columns as C
from roll.core.batch import Batch

if TYPE_CHECKING:
    import torch

    from roll.workers.types import LossFn


def training_view(batch: Batch, columns: Sequence[str]) -> Batch:
    """Only the tensor ``columns`` the trainer reads, plus the rows' image columns when the batch has them (ragged
    lists and text stay on the driver). The images must travel: without them a vision-language forward sees only
    the image placeholder embeddings, so log-probs and gradients ignore the picture the rollout was sampled from."""
    vision: dict[str, Any] = {c: batch.non_tensors[c] for c in C.VISION_COLUMNS if c in batch.non_tensors}
    return Batch({c: batch.tensors[c] for c in columns if c in batch.tensors}, vision)


def without_inert_rows(batch: Batch, loss: LossFn) -> tuple[Batch, int]:
    """``batch`` less the rows whose gradient under ``loss`` is exactly zero (what the loss declares as its
    ``inert_rows``, e.g. a GRPO group whose samples all scored the same), and how many rows were left out.

    The left-out rows' loss units travel in :data:`~roll.core.columns.CARRIED_UNITS` on the rows that stay
    (whole units per row where they are whole), so the step's normalizer, and with it the gradient, the clipped
    gradient norm and the optimizer step, are those of the whole batch; only less forward and backward work is
    done. One row always stays: a step whose rows are all inert still takes its optimizer step (Adam's moments
    move the weights even with a zero gradient), as it would have.
    """
    inert_B = loss.inert_rows(batch.tensors)
    if inert_B is None or not bool(inert_B.any()):
        return batch, 0
    keep_B = ~inert_B
    if not bool(keep_B.any()):
        keep_B[0] = True
        inert_B = ~keep_B
    kept, left = batch.select(keep_B.nonzero().reshape(-1)), batch.select(inert_B.nonzero().reshape(-1))
    carried = float(loss.count_units(left.tensors))
    carried_B = _spread(carried, len(kept))
    if C.CARRIED_UNITS in kept.tensors:
        carried_B = carried_B + kept.tensors[C.CARRIED_UNITS]
    kept[C.CARRIED_UNITS] = carried_B
    return kept, len(left)


def active_rows(batch: Batch, loss: LossFn) -> int:
    """How many rows of ``batch`` have a non-zero gradient under ``loss`` (every row when it cannot tell)."""
    inert_B = loss.inert_rows(batch.tensors)
    return len(batch) if inert_B is None else int((~inert_B).sum())


def split_inert(batch: Batch, loss: LossFn) -> tuple[Batch, int, int]:
    """:func:`without_inert_rows` and :func:`active_rows` of ``batch`` in one call: the rows to train, how many
    rows have a gradient, how many were left out."""
    batch = batch.to_torch()
    active = active_rows(batch, loss)
    trained, left_out = without_inert_rows(batch, loss)
    return trained, active, left_out


def permutation(n: int, seed: int) -> list[int]:
    """``torch.randperm(n)`` under a generator seeded with ``seed`` (the mini-batch shuffle)."""
    import torch

    order: list[int] = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return order


def _spread(units: float, rows: int) -> torch.Tensor:
    """``units`` over ``rows`` rows, summing to ``units`` exactly: whole units where ``units`` is whole."""
    import torch

    if not units.is_integer():
        return torch.full((rows,), units / rows, dtype=torch.float64)
    base, extra = divmod(int(units), rows)
    spread_B = torch.full((rows,), float(base), dtype=torch.float64)
    spread_B[:extra] += 1
    return spread_B
