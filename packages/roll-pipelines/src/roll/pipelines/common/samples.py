"""Greedy answers at evaluation as sample rows (:mod:`roll.core.samples`), for the modes that train on token
rows (sft, offline distillation): what the model answers to a few held-out prompts, beside its accuracy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from roll.core.samples import SampleRow, spread


def answer_samples(
    prompts: Sequence[Sequence[int]],
    truths: Sequence[Any],
    answers: Sequence[tuple[str, bool]],
    tokenizer: Any,
    count: int,
) -> list[SampleRow]:
    """``count`` of the ``(answer, verified)`` pairs spread over ``answers``, each with its prompt (decoded from
    its token ids, special tokens left out) and ground truth; ``correct`` is 1.0 where the task verified it."""
    return [
        {
            "prompt": str(tokenizer.decode(list(prompts[i]), skip_special_tokens=True)),
            "response": answers[i][0],
            "ground_truth": str(truths[i]),
            "correct": float(answers[i][1]),
        }
        for i in spread(len(answers), count)
    ]
