"""Chat templates render exactly; segments split a conversation at assistant turns."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from roll.core.errors import ConfigError, DataError
from roll.data.templates import QWEN_DEFAULT_SYSTEM, TEMPLATES, render, row_messages, segments

TWO_TURNS = [
    {"role": "system", "content": "be good"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "what is 1 + 1 ?"},
    {"role": "assistant", "content": "2"},
]


def test_tokenizer_template_is_the_default(tok: PreTrainedTokenizerFast) -> None:
    text = render(TWO_TURNS[1:2], template=None, tokenizer=tok, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chatml_multi_turn_with_system() -> None:
    text = render(TWO_TURNS, template="chatml", tokenizer=None, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nbe good<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nhello<|im_end|>\n"
        "<|im_start|>user\nwhat is 1 + 1 ?<|im_end|>\n"
        "<|im_start|>assistant\n2<|im_end|>\n"
    )


def test_qwen_adds_its_default_system_prompt_only_when_none_is_given() -> None:
    user = [{"role": "user", "content": "hi"}]
    text = render(user, template="qwen", tokenizer=None, add_generation_prompt=True)
    assert text == (
        f"<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    own = render(TWO_TURNS[:2], template="qwen", tokenizer=None, add_generation_prompt=False)
    assert own == "<|im_start|>system\nbe good<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_plain_template_ends_assistant_turns_with_eos(tok: PreTrainedTokenizerFast) -> None:
    text = render(TWO_TURNS[:3], template="plain", tokenizer=tok, add_generation_prompt=False)
    assert text == "System: be good\nUser: hi\nAssistant: hello<|im_end|>\n"
    prompt = render(TWO_TURNS[1:2], template="plain", tokenizer=tok, add_generation_prompt=True)
    assert prompt == "User: hi\nAssistant: "


def test_unknown_template_lists_known_names() -> None:
    with pytest.raises(ConfigError) as err:
        render(TWO_TURNS, template="vicuna", tokenizer=None, add_generation_prompt=False)
    for name in TEMPLATES:
        assert name in str(err.value)
    assert "'vicuna'" in str(err.value)


def test_missing_tokenizer_template_suggests_fallbacks(tok_no_template: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ConfigError, match="no chat template"):
        render(TWO_TURNS, template=None, tokenizer=tok_no_template, add_generation_prompt=False)


def test_bad_role_is_a_data_error() -> None:
    with pytest.raises(DataError, match=r"messages\[0\]: role 'robot'"):
        render(
            [{"role": "robot", "content": "x"}],
            template="chatml",
            tokenizer=None,
            add_generation_prompt=False,
        )


def test_segments_mark_each_assistant_turn_including_its_end() -> None:
    pieces = segments(TWO_TURNS, template="chatml", tokenizer=None)
    assert pieces == [
        (
            "<|im_start|>system\nbe good<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
            False,
        ),
        ("hello<|im_end|>\n", True),
        ("<|im_start|>user\nwhat is 1 + 1 ?<|im_end|>\n<|im_start|>assistant\n", False),
        ("2<|im_end|>\n", True),
    ]
    assert "".join(t for t, _ in pieces) == render(
        TWO_TURNS, template="chatml", tokenizer=None, add_generation_prompt=False
    )


def test_segments_reject_templates_that_rewrite_earlier_turns(tok: PreTrainedTokenizerFast) -> None:
    # Drops every assistant turn but the last, like templates that strip past reasoning.
    rewriting = (
        "{%- for m in messages -%}{%- if m['role'] != 'assistant' or loop.last -%}"
        "{{- m['role'] + ':' + m['content'] + '\\n' -}}{%- endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}assistant:{%- endif -%}"
    )
    odd = tok.__class__(tokenizer_object=tok.backend_tokenizer, eos_token="<|im_end|>")
    odd.chat_template = rewriting
    with pytest.raises(DataError, match="not prefix-stable"):
        segments(TWO_TURNS[1:], template=None, tokenizer=odd)


def test_row_messages_from_fields() -> None:
    row = {"system": "be good", "prompt": "add", "query": "1 + 1", "response": "2"}
    assert row_messages(row) == [
        {"role": "system", "content": "be good"},
        {"role": "user", "content": "add\n\n1 + 1"},
        {"role": "assistant", "content": "2"},
    ]
    assert row_messages(row, with_response=False)[-1] == {"role": "user", "content": "add\n\n1 + 1"}
    assert row_messages({"messages": TWO_TURNS}, with_response=False) == TWO_TURNS[:-1]
    assert row_messages({"prompt": TWO_TURNS[1:2]}) == TWO_TURNS[1:2]
