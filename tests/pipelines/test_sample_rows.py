"""roll.pipelines.common.samples with the offline tokenizer: greedy answers and preference pairs as sample rows."""

from __future__ import annotations

from roll.data.tokenizer import build_tokenizer
from roll.pipelines.common.samples import answer_samples, pair_samples


def test_answer_samples_decode_prompts_and_keep_the_verdicts() -> None:
    """Five answers, two shown: rows 0 and 2 (spread(5, 2)); prompts decoded back from their ids."""
    tok = build_tokenizer()
    prompts = [f"What is {i}+1?" for i in range(5)]
    ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    answers = [(f"The answer is {i + 1}.", i % 2 == 0) for i in range(5)]
    rows = answer_samples(ids, [i + 1 for i in range(5)], answers, tok, 2)
    assert rows == [
        {"prompt": "What is 0+1?", "response": "The answer is 1.", "ground_truth": "1", "correct": 1.0},
        {"prompt": "What is 2+1?", "response": "The answer is 3.", "ground_truth": "3", "correct": 1.0},
    ]


def test_pair_samples_split_prompt_and_responses() -> None:
    """A pair's chosen/rejected values 0.5 vs 0.25 -> correct 1; 0.1 vs 0.3 -> 0; ties count as not correct."""
    tok = build_tokenizer()

    def row(prompt: str, chosen: str, rejected: str) -> dict[str, list[int]]:
        enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
        return {"prompt_ids": enc(prompt), "chosen_ids": enc(chosen), "rejected_ids": enc(rejected)}

    rows = [row("What is 2+2?", " 4", " 5"), row("What is 1+1?", " 2", " 3"), row("What is 3+3?", " 6", " 6")]
    shown = pair_samples(rows, [0.5, 0.1, 0.2], [0.25, 0.3, 0.2], tok, 4, value="score")
    assert [(r["prompt"], r["chosen"].strip(), r["rejected"].strip(), r["correct"]) for r in shown] == [
        ("What is 2+2?", "4", "5", 1.0),
        ("What is 1+1?", "2", "3", 0.0),
        ("What is 3+3?", "6", "6", 0.0),
    ]
    assert shown[0]["chosen_score"] == 0.5 and shown[0]["rejected_score"] == 0.25
