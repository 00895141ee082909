"""What the rewards that host a transformers model share: loading its tokenizer, picking the device, and
encoding texts in batches (``reward_model`` and ``llm_judge_local``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import torch


def load_tokenizer(path: str, **kwargs: Any) -> Any:
    """The tokenizer at ``path``, with the eos token as pad when it has no pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def pick_device(option: Literal["cpu", "cuda", "auto"]) -> torch.device:
    """``auto``: CUDA when this worker sees a GPU, else the CPU."""
    cuda = option == "cuda" or (option == "auto" and torch.cuda.is_available())
    return torch.device("cuda" if cuda else "cpu")


def encoded_batches(
    tokenizer: Any, texts: list[str], *, batch_size: int, max_length: int, device: torch.device
) -> Iterator[Any]:
    """``texts`` in padded, truncated batches of ``batch_size`` (no special tokens added: the texts are
    rendered already), on ``device``."""
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[start : start + batch_size],
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=max_length,
            add_special_tokens=False,
        )
        yield enc.to(device)
