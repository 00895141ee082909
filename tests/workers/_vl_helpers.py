"""Shared bits of the vision-language strategy tests (test_vision, test_video): the tiny-vl-1m kit, padding, and the
check that pixels reach the scores."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from roll.workers.roles.config import ModelConfig
from roll.workers.roles.model import load_causal_lm


def load_kit() -> dict[str, Any]:
    """tiny-vl-1m's folder, model (through the roles' loader), tokenizer and image processor."""
    from transformers import AutoTokenizer

    from roll.data.models import load_image_processor
    from roll.data.tiny_vl import tiny_vl_model_path

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


def assert_pixels_move_the_scores(
    kit: dict[str, Any], a: dict[str, Any], b: dict[str, Any], columns: Sequence[str], after: int
) -> None:
    """Rows ``a``, ``b``, ``a`` hold the same tokens and differ only in pixels: the hf scorer's log-probs of the
    last ``after`` tokens (the text after the vision span) differ between ``a`` and ``b``, equal for the two
    ``a``s, and scoring one row per micro-batch equals scoring the three together."""
    from roll.workers.config import HFInferConfig
    from roll.workers.hf_infer import HFInferStrategy

    assert a["ids"] == b["ids"]  # same tokens: only the pixels differ
    ids, mask, vision = padded([a, b, a], kit["tokenizer"].pad_token_id, columns)
    one_per_mb = HFInferStrategy(kit["model"], HFInferConfig(max_tokens_per_micro_batch=16))
    logp = one_per_mb.compute_logprobs(ids, mask, vision=vision).logp_BT
    tail = slice(len(a["ids"]) - after, len(a["ids"]))
    assert (logp[0, tail] - logp[1, tail]).abs().max() > 1e-4
    torch.testing.assert_close(logp[0], logp[2])
    whole = HFInferStrategy(kit["model"], HFInferConfig()).compute_logprobs(ids, mask, vision=vision).logp_BT
    torch.testing.assert_close(logp, whole, rtol=0, atol=1e-5)
