"""Column views of a batch: what goes to a worker is only the columns it reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from roll.core import columns as C
from roll.core.batch import Batch


def training_view(batch: Batch, columns: Sequence[str]) -> Batch:
    """Only the tensor ``columns`` the trainer reads, plus the rows' image columns when the batch has them (ragged
    lists and text stay on the driver). The images must travel: without them a vision-language forward sees only
    the image placeholder embeddings, so log-probs and gradients ignore the picture the rollout was sampled from."""
    vision: dict[str, Any] = {c: batch.non_tensors[c] for c in C.VISION_COLUMNS if c in batch.non_tensors}
    return Batch({c: batch.tensors[c] for c in columns if c in batch.tensors}, vision)
