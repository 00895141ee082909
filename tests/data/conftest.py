"""Fixtures of roll.data's tests: a tiny word-level ChatML tokenizer built in memory, independent of roll's own.

The tokenizer splits on every whitespace character and punctuation mark and maps whole words, so expected ids can
be written by hand (``tok.convert_tokens_to_ids([...])``) in the tests.
"""

from __future__ import annotations

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
WORDS = [
    "system",
    "user",
    "assistant",
    "tool",
    "you",
    "are",
    "a",
    "helpful",
    "what",
    "is",
    "and",
    "the",
    "answer",
    "hi",
    "hello",
    "ok",
    "yes",
    "no",
    "good",
    "bad",
    "User",
    "Assistant",
    "System",
    "question",
]
SYMBOLS = [" ", "\n", ":", "?", ".", "+", "=", ","]
NUMBERS = [str(n) for n in range(50)]

CHATML = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def make_tokenizer(chat_template: str | None = CHATML) -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose vocab is SPECIALS, then SYMBOLS, WORDS and NUMBERS, in that order."""
    vocab = {token: i for i, token in enumerate(SPECIALS + SYMBOLS + WORDS + NUMBERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s|[^\w\s]"), behavior="isolated")
    tok = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="right",
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


@pytest.fixture(scope="session")
def tok() -> PreTrainedTokenizerFast:
    return make_tokenizer()


@pytest.fixture(scope="session")
def tok_no_template() -> PreTrainedTokenizerFast:
    return make_tokenizer(chat_template=None)
