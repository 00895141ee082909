"""Column views of a batch: what goes to a worker is only the tensors it reads."""

from __future__ import annotations

from collections.abc import Sequence

from roll.core.batch import Batch


def training_view(batch: Batch, columns: Sequence[str]) -> Batch:
    """Only the tensor ``columns`` the trainer reads (ragged lists and text stay on the driver)."""
    return Batch({c: batch.tensors[c] for c in columns if c in batch.tensors})
