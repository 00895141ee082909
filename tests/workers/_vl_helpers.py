"""Shared bits of the vision-language strategy tests (test_vision, test_video): the tiny-vl-1m kit and padding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from roll.workers.roles.config import ModelConfig
from roll.workers.roles.model import load_causal_lm


def load_kit() -> dict[str, Any]:
    """tiny-vl-1m's folder, model (through the roles' loader), tokenizer and image processor."""
    from transformers import AutoTokenizer

    from roll.data.tiny_vl import load_image_processor, tiny_vl_model_path

    path = tiny_vl_model_path("tiny-vl-1m")
    return {
        "path": str(path),
        "model": load_causal_lm(ModelConfig(path=str(path)), "test"),
        "tokenizer": AutoTokenizer.from_pretrained(path),
        "processor": load_image_processor(str(path)),
    }


def padded(
    rows: Sequence[dict[str, Any]], pad: int, columns: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor, dict[str, list[Any]]]:
    """Right-padded ``ids [B, T]`` and ``mask [B, T]`` of the rows' ``ids``, and their per-row ``columns``."""
    T = max(len(r["ids"]) for r in rows)
    ids = torch.full((len(rows), T), pad)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r["ids"])] = torch.tensor(r["ids"])
        mask[i, : len(r["ids"])] = 1
    return ids, mask, {k: [r[k] for r in rows] for k in columns}
