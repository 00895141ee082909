"""The offline tokenizer: deterministic, digit-splitting, cached, and identical under every loader."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from roll.core.errors import DataError
from roll.data._cache import build_once
from roll.data.tokenizer import (
    CHAT_TEMPLATE,
    build_tokenizer,
    save_tokenizer_into,
    tokenizer_path,
)

TEXTS = [
    "What is 123+45?",
    "The answer is -168.",
    "  héllo wörld 1234567890\n\n\tx  ",
    "e\u0301 vs \u00e9, ﬁ",  # NFC normalisation must agree between loaders
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "I'm 12,345.67 and don't",
    "日本語 😀",
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("roll-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLL_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def tok(cache_dir: Path):  # type: ignore[no-untyped-def]
    return build_tokenizer()


def test_builds_deterministically_in_fresh_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = []
    for run in ("a", "b"):
        monkeypatch.setenv("ROLL_CACHE_DIR", str(tmp_path / run))
        start = time.perf_counter()
        build_tokenizer()
        elapsed = time.perf_counter() - start
        assert elapsed < 30, f"tokenizer build took {elapsed:.1f}s"
        path = tokenizer_path()
        assert path.is_relative_to(tmp_path / run)
        files.append({f.name: f.read_bytes() for f in path.iterdir()})
    assert files[0] == files[1]


def test_digits_are_single_tokens(tok) -> None:  # type: ignore[no-untyped-def]
    assert tok.tokenize("9876543210") == list("9876543210")
    assert not [t for t in tok.get_vocab() if sum(c.isdigit() for c in t) > 1]
    ids = tok("What is 23+45?")["input_ids"]
    assert [tok.decode([i]) for i in ids[-6:]] == ["2", "3", "+", "4", "5", "?"]


def test_special_tokens_and_defaults(tok) -> None:  # type: ignore[no-untyped-def]
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == (
        "<|endoftext|>",
        "<|im_end|>",
        "<|pad|>",
        "<|unk|>",
    )
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]) == [
        0,
        1,
        2,
        3,
    ]
    assert tok.padding_side == "right"
    assert tok("hi")["input_ids"] == tok("hi", add_special_tokens=False)["input_ids"]  # no BOS added
    for text in TEXTS[:3]:
        assert tok.decode(tok(text)["input_ids"]) == text


def test_chat_template_renders_exactly(tok) -> None:  # type: ignore[no-untyped-def]
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "The answer is 5."},
        {"role": "user", "content": "What is 4*4?"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\nThe answer is 5.<|im_end|>\n"
        "<|im_start|>user\nWhat is 4*4?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = tok.apply_chat_template(messages[1:3], tokenize=False)
    assert (
        no_prompt
        == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\nThe answer is 5.<|im_end|>\n"
    )


def test_assistant_mask_covers_replies_and_their_end_marker(tok) -> None:  # type: ignore[no-untyped-def]
    messages = [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "The answer is 5."},
        {"role": "user", "content": "What is 1+1?"},
        {"role": "assistant", "content": "The answer is 2."},
    ]
    out = tok.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    masked = [i for i, keep in zip(out["input_ids"], out["assistant_masks"]) if keep]
    assert tok.decode(masked) == "The answer is 5.<|im_end|>The answer is 2.<|im_end|>"


def test_unknown_role_raises(tok) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception, match="unknown chat role: robot"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_save_and_load_round_trip(tok, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from transformers import PreTrainedTokenizerFast

    tok.save_pretrained(tmp_path)
    again = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    for text in TEXTS:
        assert again(text)["input_ids"] == tok(text)["input_ids"]
    assert again.chat_template == tok.chat_template == CHAT_TEMPLATE
    assert again.padding_side == "right"
    assert again.all_special_tokens == tok.all_special_tokens


def test_auto_tokenizer_from_qwen2_model_folder_gives_identical_ids(tok, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The pitfall: ``model_type: qwen2`` makes AutoTokenizer build Qwen2Tokenizer with its own pipeline."""
    from transformers import AutoTokenizer, Qwen2Config

    Qwen2Config(vocab_size=len(tok)).save_pretrained(tmp_path)
    save_tokenizer_into(tmp_path)
    auto = AutoTokenizer.from_pretrained(tmp_path)
    assert type(auto).__name__ == "Qwen2Tokenizer"  # if this changes, the test below still guards the ids
    for text in TEXTS:
        assert auto(text)["input_ids"] == tok(text)["input_ids"], text
    chat = [{"role": "user", "content": "What is 12+30?"}]
    assert auto.apply_chat_template(chat, add_generation_prompt=True) == tok.apply_chat_template(
        chat, add_generation_prompt=True
    )
    assert (auto.eos_token_id, auto.pad_token_id, auto.bos_token_id) == (
        tok.eos_token_id,
        tok.pad_token_id,
        tok.bos_token_id,
    )
    assert auto.padding_side == "right" and len(auto) == len(tok)


def test_cached_folder_is_reused(tok, cache_dir: Path) -> None:  # type: ignore[no-untyped-def]
    path = tokenizer_path()
    assert path.is_relative_to(cache_dir)
    stamp = (path / "tokenizer.json").stat().st_mtime_ns
    build_tokenizer()
    assert (path / "tokenizer.json").stat().st_mtime_ns == stamp


def test_unknown_tokenizer_name_raises() -> None:
    with pytest.raises(DataError, match="known: roll-tiny"):
        tokenizer_path("gpt-5")


def test_build_once_builds_once_under_contention(tmp_path: Path) -> None:
    calls: list[int] = []

    def build(folder: Path) -> None:
        calls.append(1)
        time.sleep(0.2)
        (folder / "done").write_text("ok")

    target = tmp_path / "thing"
    threads = [threading.Thread(target=build_once, args=(target, build)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert (target / "done").read_text() == "ok"
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == ["thing"]


def test_build_once_leaves_nothing_on_failure(tmp_path: Path) -> None:
    def fail(folder: Path) -> None:
        (folder / "half").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_once(tmp_path / "thing", fail)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_think_template_drops_past_reasoning_as_qwen3s_does(cache_dir: Path) -> None:
    """The thinking kit's template, against Qwen3's documented behaviour: reasoning is rendered only for assistant
    turns after the last user query (normalized to ``<think>\\n{r}\\n</think>\\n\\n{answer}``), dropped from
    earlier ones; a last turn without reasoning gets an empty think block; tool results are user turns that are
    not queries; ``enable_thinking=False`` prefills an empty think block. ``<think>``/``</think>`` are single,
    non-special tokens (decoding keeps them), on roll-tiny's vocabulary."""
    think, plain = build_tokenizer("roll-tiny-think"), build_tokenizer()
    assert think.encode("What is 2+3?") == plain.encode("What is 2+3?")
    ids = think.encode("<think>x</think>")
    assert ids[0] == think.convert_tokens_to_ids("<think>") and len(think.encode("<think>")) == 1
    assert think.decode(ids, skip_special_tokens=True) == "<think>x</think>"
    sys, u1, u2 = (
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q1"},
        {"role": "user", "content": "Q2"},
    )
    a1 = {"role": "assistant", "content": "<think>\nr1\n</think>\n\nA1"}
    a2 = {"role": "assistant", "content": "<think>r2</think>A2"}
    head = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n"
    assert think.apply_chat_template([sys, u1, a1, u2, a2], tokenize=False) == (
        head + "A1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n"
    )
    assert think.apply_chat_template([sys, u1, a1, u2], tokenize=False, add_generation_prompt=True) == (
        head + "A1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n"
    )
    bare = {"role": "assistant", "content": "A1"}
    assert think.apply_chat_template([sys, u1, bare], tokenize=False) == (
        head + "<think>\n\n</think>\n\nA1<|im_end|>\n"
    )
    tool = {"role": "tool", "content": "42"}
    assert think.apply_chat_template([sys, u1, a1, tool, a2], tokenize=False) == (
        head
        + "<think>\nr1\n</think>\n\nA1<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n"
    )
    off = think.apply_chat_template(
        [sys, u1], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off == head + "<think>\n\n</think>\n\n"
