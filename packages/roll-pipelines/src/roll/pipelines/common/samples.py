"""Evaluation rows as sample rows (:mod:`roll.core.samples`) for the modes that train on token rows: greedy
answers (sft, offline distillation: what the model answers to a few held-out prompts, beside its accuracy) and
preference pairs (dpo, reward model: both responses and how the model values each)."""

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
            "prompt": _decode(tokenizer, prompts[i]),
            "response": answers[i][0],
            "ground_truth": str(truths[i]),
            "correct": float(answers[i][1]),
        }
        for i in spread(len(answers), count)
    ]


def pair_samples(
    rows: Sequence[Any],
    chosen_P: Sequence[float],
    rejected_P: Sequence[float],
    tokenizer: Any,
    count: int,
    *,
    value: str,
) -> list[SampleRow]:
    """``count`` preference pairs spread over ``rows`` (preference rows, :func:`~roll.pipelines.common.data.
    pair_sequences`): the prompt, both responses, ``chosen_<value>`` and ``rejected_<value>`` (a reward model's
    scores, DPO's implicit rewards), and ``correct`` 1.0 where the chosen one is valued higher."""
    from roll.pipelines.common.data import pair_sequences

    out: list[SampleRow] = []
    for i in spread(len(rows), count):
        chosen, rejected, n_prompt = pair_sequences(rows[i])
        out.append(
            {
                "prompt": _decode(tokenizer, chosen[:n_prompt]),
                "chosen": _decode(tokenizer, chosen[n_prompt:]),
                "rejected": _decode(tokenizer, rejected[n_prompt:]),
                f"chosen_{value}": float(chosen_P[i]),
                f"rejected_{value}": float(rejected_P[i]),
                "correct": float(chosen_P[i] > rejected_P[i]),
            }
        )
    return out


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return str(tokenizer.decode(list(ids), skip_special_tokens=True))
