"""Tokenization: exact label masks, shared-prompt pairs, generation prompts, and counted length policies."""

from __future__ import annotations

import datasets
import pytest
from transformers import PreTrainedTokenizerFast

from roll.core.errors import DataError
from roll.data.config import TokenizeConfig
from roll.data.tokenize import (
    DROPPED,
    KEPT,
    TRUNCATED,
    LengthReport,
    limit_prompt,
    limit_sft,
    tokenize_dataset,
)

X = -100
CONVERSATION = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "what is 1 + 1 ?"},
    {"role": "assistant", "content": "2"},
]


def ids(tok: PreTrainedTokenizerFast, tokens: list[str]) -> list[int]:
    out = tok.convert_tokens_to_ids(tokens)
    assert isinstance(out, list)
    return out


def test_sft_labels_train_only_assistant_turns_exactly(tok: PreTrainedTokenizerFast) -> None:
    ds = datasets.Dataset.from_list([{"messages": CONVERSATION}])
    out, report = tokenize_dataset(ds, kind="sft", tokenizer=tok, cfg=TokenizeConfig())
    row = out[0]
    # (token, trained) in order: the generation header is context, the reply and its <|im_end|>\n are trained.
    expected = [
        ("<|im_start|>", 0), ("user", 0), ("\n", 0), ("hi", 0), ("<|im_end|>", 0), ("\n", 0),
        ("<|im_start|>", 0), ("assistant", 0), ("\n", 0),
        ("hello", 1), ("<|im_end|>", 1), ("\n", 1),
        ("<|im_start|>", 0), ("user", 0), ("\n", 0),
        ("what", 0), (" ", 0), ("is", 0), (" ", 0), ("1", 0), (" ", 0), ("+", 0), (" ", 0), ("1", 0), (" ", 0),
        ("?", 0), ("<|im_end|>", 0), ("\n", 0),
        ("<|im_start|>", 0), ("assistant", 0), ("\n", 0),
        ("2", 1), ("<|im_end|>", 1), ("\n", 1),
    ]  # fmt: skip
    token_ids = ids(tok, [t for t, _ in expected])
    assert row["input_ids"] == token_ids
    assert row["labels"] == [i if trained else X for i, (_, trained) in zip(token_ids, expected)]
    assert row["length"] == len(expected)
    assert (report.kept, report.truncated, report.dropped) == (1, 0, 0)
    # Segment-wise tokenization agrees with tokenizing the whole render for this tokenizer.
    full = tok.apply_chat_template(CONVERSATION, tokenize=False)
    assert tok(full, add_special_tokens=False)["input_ids"] == token_ids


def test_sft_from_prompt_and_response_fields(tok: PreTrainedTokenizerFast) -> None:
    ds = datasets.Dataset.from_list([{"prompt": "hi", "response": "hello", "ground_truth": "x"}])
    out, _ = tokenize_dataset(ds, kind="sft", tokenizer=tok, cfg=TokenizeConfig(template="plain"))
    tokens = tok.convert_ids_to_tokens(out[0]["input_ids"])
    assert tokens == ["User", ":", " ", "hi", "\n", "Assistant", ":", " ", "hello", "<|im_end|>", "\n"]
    assert out[0]["labels"] == [X] * 8 + ids(tok, ["hello", "<|im_end|>", "\n"])
    assert out[0]["ground_truth"] == "x"  # other columns pass through


def test_limit_sft_policies() -> None:
    seq, labels = [1, 2, 3, 4, 5], [X, X, 3, 4, 5]
    assert limit_sft(seq, labels, 5, "drop") == (seq, labels, KEPT)
    assert limit_sft(seq, labels, 4, "truncate") == ([1, 2, 3, 4], [X, X, 3, 4], TRUNCATED)
    assert limit_sft(seq, labels, 2, "truncate") == ([], [], DROPPED)  # only prompt left: nothing to learn
    assert limit_sft(seq, labels, 4, "drop") == ([], [], DROPPED)
    with pytest.raises(DataError, match=r"row 7: sequence has 5 tokens > 4 \(length_policy=error\)"):
        limit_sft(seq, labels, 4, "error", index=7)


def test_limit_prompt_keeps_the_end() -> None:
    assert limit_prompt([1, 2, 3, 4], 3, "truncate") == ([2, 3, 4], TRUNCATED)
    assert limit_prompt([1, 2, 3], 3, "error") == ([1, 2, 3], KEPT)


def _sft_rows(reply_words: list[int]) -> datasets.Dataset:
    # The prompt render is 9 tokens, n reply words are 2n - 1 (words and spaces), "<|im_end|>\n" is 2: 10 + 2n.
    rows = [{"prompt": "hi", "response": " ".join(["yes"] * n)} for n in reply_words]
    return datasets.Dataset.from_list(rows)


@pytest.mark.parametrize(
    ("policy", "counts", "lengths"),
    [("truncate", (2, 2, 0), [12, 14, 16, 16]), ("drop", (2, 0, 2), [12, 14])],
)
def test_length_policy_counts_are_exact(
    tok: PreTrainedTokenizerFast, policy: str, counts: tuple[int, int, int], lengths: list[int]
) -> None:
    # Lengths 12, 14, 18, 20 with max_length 16: two fit, two are over.
    ds = _sft_rows([1, 2, 4, 5])
    cfg = TokenizeConfig(max_length=16, length_policy=policy)
    out, report = tokenize_dataset(ds, kind="sft", tokenizer=tok, cfg=cfg)
    assert (report.kept, report.truncated, report.dropped) == counts
    assert report.total == 4
    assert out["length"] == lengths
    assert str(report).startswith(f"length policy {policy} (max_length 16): of 4 rows")


def test_error_policy_names_the_row(tok: PreTrainedTokenizerFast) -> None:
    cfg = TokenizeConfig(max_length=16, length_policy="error")
    with pytest.raises(DataError, match=r"row 2: sequence has 18 tokens > 16"):
        tokenize_dataset(_sft_rows([1, 2, 4]), kind="sft", tokenizer=tok, cfg=cfg)


def test_filter_that_empties_the_dataset_says_so(tok: PreTrainedTokenizerFast) -> None:
    cfg = TokenizeConfig(max_length=10, length_policy="drop")
    with pytest.raises(
        DataError, match=r"no rows left after the length filter \(length policy drop \(max_length 10\)"
    ):
        tokenize_dataset(_sft_rows([2, 3]), kind="sft", tokenizer=tok, cfg=cfg)


def test_missing_field_lists_found_columns_and_mapping_key(tok: PreTrainedTokenizerFast) -> None:
    ds = datasets.Dataset.from_list([{"question": "hi", "answer": "2"}])
    with pytest.raises(DataError) as err:
        tokenize_dataset(ds, kind="prompt", tokenizer=tok, cfg=TokenizeConfig())
    message = str(err.value)
    assert "columns found: ['question', 'answer']" in message
    assert "`fields.prompt: <column>`" in message


def test_preference_pairs_share_the_prompt(tok: PreTrainedTokenizerFast) -> None:
    row = {"prompt": "what is 1 + 1 ?", "chosen": "2", "rejected": "the answer is 3"}
    out, report = tokenize_dataset(
        datasets.Dataset.from_list([row]), kind="preference", tokenizer=tok, cfg=TokenizeConfig()
    )
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": row["prompt"]}], tokenize=False, add_generation_prompt=True
    )
    assert out[0]["prompt_ids"] == tok(prompt, add_special_tokens=False)["input_ids"]
    assert out[0]["chosen_ids"] == ids(tok, ["2", "<|im_end|>", "\n"])
    assert out[0]["rejected_ids"] == ids(tok, ["the", " ", "answer", " ", "is", " ", "3", "<|im_end|>", "\n"])
    assert out[0]["length"] == len(out[0]["prompt_ids"]) + 9
    assert report.kept == 1


def test_preference_conversational_layout_and_truncation(tok: PreTrainedTokenizerFast) -> None:
    row = {
        "prompt": [{"role": "user", "content": "hi"}],
        "chosen": [{"role": "assistant", "content": "yes yes yes"}],
        "rejected": [{"role": "assistant", "content": "no"}],
    }
    cfg = TokenizeConfig(max_length=12)  # prompt is 9 tokens: 3 left for each continuation
    out, report = tokenize_dataset(
        datasets.Dataset.from_list([row]), kind="preference", tokenizer=tok, cfg=cfg
    )
    assert len(out[0]["prompt_ids"]) == 9
    assert out[0]["chosen_ids"] == ids(tok, ["yes", " ", "yes"])
    assert out[0]["rejected_ids"] == ids(tok, ["no", "<|im_end|>", "\n"])
    assert report.truncated == 1


def test_rl_prompts_end_with_the_generation_prompt_and_truncate_left(tok: PreTrainedTokenizerFast) -> None:
    ds = datasets.Dataset.from_list(
        [{"prompt": "hi", "ground_truth": "1"}, {"prompt": "what is 1 + 1 ?", "ground_truth": "2"}]
    )
    cfg = TokenizeConfig(max_prompt_length=9)
    out, report = tokenize_dataset(ds, kind="prompt", tokenizer=tok, cfg=cfg)
    assert tok.convert_ids_to_tokens(out[0]["prompt_ids"]) == [
        "<|im_start|>", "user", "\n", "hi", "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n",
    ]  # fmt: skip
    assert tok.convert_ids_to_tokens(out[1]["prompt_ids"])[-4:] == ["\n", "<|im_start|>", "assistant", "\n"]
    assert len(out[1]["prompt_ids"]) == 9
    assert out["ground_truth"] == ["1", "2"]
    assert (report.kept, report.truncated, report.dropped) == (1, 1, 0)


def test_truncated_prompts_are_flagged_per_row_and_summarised_once_at_warning(
    tok: PreTrainedTokenizerFast, caplog: pytest.LogCaptureFixture
) -> None:
    """The 9-token cap cuts the second prompt only: its row says so (the RL pipelines count the flag per step as
    ``data/prompt_truncated``), and one WARNING (not INFO, which no handler shows) summarises the report."""
    import logging

    from roll.core import columns as C

    ds = datasets.Dataset.from_list(
        [{"prompt": "hi", "ground_truth": "1"}, {"prompt": "what is 1 + 1 ?", "ground_truth": "2"}]
    )
    with caplog.at_level(logging.INFO, logger="roll.data.tokenize"):
        out, _ = tokenize_dataset(ds, kind="prompt", tokenizer=tok, cfg=TokenizeConfig(max_prompt_length=9))
    assert out[C.PROMPT_TRUNCATED] == [False, True]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "1 of 2 rows were longer than the limit" in warnings[0]
    assert "1 truncated" in warnings[0] and "tokenize.max_length" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="roll.data.tokenize"):
        tokenize_dataset(ds, kind="prompt", tokenizer=tok, cfg=TokenizeConfig(max_prompt_length=64))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # nothing cut, nothing to warn


def test_num_proc_and_streaming_agree_with_one_process(tok: PreTrainedTokenizerFast) -> None:
    ds = _sft_rows([1, 2, 3, 4, 5, 6] * 4)
    cfg = TokenizeConfig(max_length=16, length_policy="drop")
    one, report = tokenize_dataset(ds, kind="sft", tokenizer=tok, cfg=cfg, batch_size=5)
    two, report2 = tokenize_dataset(
        ds, kind="sft", tokenizer=tok, cfg=cfg.model_copy(update={"num_proc": 2}), batch_size=5
    )
    assert two["input_ids"] == one["input_ids"]
    assert (report2.kept, report2.dropped) == (report.kept, report.dropped) == (12, 12)
    stream, live = tokenize_dataset(
        ds.to_iterable_dataset(), kind="sft", tokenizer=tok, cfg=cfg, batch_size=5
    )
    assert [r["input_ids"] for r in stream] == one["input_ids"]
    assert (live.kept, live.truncated, live.dropped) == (12, 0, 12)


def test_length_report_add() -> None:
    report = LengthReport(policy="drop", max_length=4)
    for status in (KEPT, KEPT, TRUNCATED, DROPPED):
        report.add(status)
    assert (report.kept, report.truncated, report.dropped, report.total) == (2, 1, 1, 4)
