"""The generation-heavy benchmark's task and reward (``bench_gen_heavy_vs_trl.py``), in a module of its own so
roll's ``python`` reward workers import it by file path and TRL's side calls the same function.

Prompt ``"Write digits, mostly D."``; the answer is a run of digits, no stop: the warm-up (SFT) teaches 200-digit
runs in which ``D`` makes a fifth of the digits and never the end-of-turn token, so every completion runs to the
token limit on both sides (equal lengths at step 1). The reward is the share of ``D`` among the first
``REWARD_CHARS`` characters of the completion: a sampled run's share varies from sample to sample, so rewards vary
within every group and GRPO trains on every row (no zero-advantage skip), and raising the share is learnable.
"""

from __future__ import annotations

import random
from typing import Any

REWARD_CHARS = 128
TARGET_SHARE = 0.2


def prompt_of(digit: int) -> str:
    return f"Write digits, mostly {digit}."


def rl_rows(n: int) -> list[dict[str, Any]]:
    """``n`` RL rows (messages, ground truth = the digit), digits in turn."""
    return [
        {
            "messages": [{"role": "user", "content": prompt_of(i % 10)}],
            "ground_truth": str(i % 10),
            "tag": "digits",
        }
        for i in range(n)
    ]


def sft_answer(digit: int, length: int, rng: random.Random) -> str:
    """``length`` digits, each ``digit`` with probability ``TARGET_SHARE``, else uniform over the other nine."""
    others = [str(d) for d in range(10) if d != digit]
    return "".join(str(digit) if rng.random() < TARGET_SHARE else rng.choice(others) for _ in range(length))


def digit_share(response: str, ground_truth: str, **_: Any) -> float:
    """Share of the target digit among the first ``REWARD_CHARS`` characters (0 for an empty response)."""
    head = response[:REWARD_CHARS]
    return head.count(ground_truth) / max(len(head), 1)
