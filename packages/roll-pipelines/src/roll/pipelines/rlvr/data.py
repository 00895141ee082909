"""RLVR's data: prompt rows fed request by request, the held-out prompts, and warm-up SFT batches.

Prompt rows come from :func:`roll.pipelines.common.data.prepare_data` (kind ``prompt``): ``prompt_ids`` plus the
canonical columns the rewards read (``prompt``, ``ground_truth``, ``tag``). Sources mix by weight in
``data.sources`` (datasets' ``interleave_datasets``), which is how domains mix in a run.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from roll.core import columns as C
from roll.core.batch import Batch
from roll.data.vision import vision_columns

Row = dict[str, Any]
PROMPT_COLUMNS = (C.PROMPT, C.GROUND_TRUTH, C.TAG)
CARRY_COLUMNS = (*PROMPT_COLUMNS, C.PROMPT_TRUNCATED)
IMAGE_COLUMNS = (*C.VISION_COLUMNS, C.IMAGES, C.VIDEOS)
"""What image and video prompts also carry into their samples (patches for training, raw media for vLLM)."""


def prompt_batch(rows: Sequence[Row]) -> Batch:
    """One row per prompt: ``prompt_ids`` (lists) and the text columns rewards need."""
    columns: dict[str, list[Any]] = {C.PROMPT_IDS: [list(r[C.PROMPT_IDS]) for r in rows]}
    for name in PROMPT_COLUMNS:
        columns[name] = [str(r.get(name) or "") for r in rows]
    columns[C.PROMPT_TRUNCATED] = [bool(r.get(C.PROMPT_TRUNCATED)) for r in rows]
    images = vision_columns(rows)
    if images:
        columns.update(images)
        columns[C.IMAGES] = [r.get(C.IMAGES) for r in rows]
        columns[C.VIDEOS] = [r.get(C.VIDEOS) for r in rows]
    return Batch({}, columns)


class PromptFeeder:
    """Endless, epoch-shuffled prompts, ``feeder(n)`` at a time; its position is checkpoint state."""

    def __init__(self, rows: Sequence[Row], *, seed: int) -> None:
        if not rows:
            raise ValueError("no training prompts: data.sources produced no rows")
        self.rows, self.seed = list(rows), seed
        self.epoch, self.position = 0, 0
        self._order = self._epoch_order()

    def _epoch_order(self) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(f"{self.seed}:{self.epoch}").shuffle(order)
        return order

    def __call__(self, n: int) -> Batch:
        picked: list[Row] = []
        while len(picked) < n:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._epoch_order()
            picked.append(self.rows[self._order[self.position]])
            self.position += 1
        return prompt_batch(picked)

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._epoch_order()


def sft_batch(rows: Sequence[Row], *, pad_id: int) -> Batch:
    """Right-padded warm-up batch: ``input_ids_BT``, ``attention_mask_BT``, ``labels_BT`` (-100 off target).
    Builds torch tensors: the collator imports torch (on first call, so that importing this module does not)."""
    from roll.data.collate import collate_sft

    return Batch(collate_sft(rows, pad_id=pad_id), vision_columns(rows))
