"""parse_action on well-formed and malformed model outputs."""

from __future__ import annotations

import pytest

from roll.agentic.parsing import ActionParseConfig, parse_action, strip_think

ACTIONS = ["Up", "Down", "Left", "Right"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>Up</answer>", ("Up", True)),
        ("<think>the box is left</think>\n<answer>Left</answer>", ("Left", True)),
        ("<answer> right. </answer>", ("Right", True)),
        ("<answer>Up</answer> then <answer>Down</answer>", ("Down", True)),
        ("<answer>I go Up</answer>", ("Up", False)),
        ("I will go Down now", ("Down", False)),
        ("<answer>Jump</answer>", (None, False)),
        ("nothing useful", (None, False)),
        ("", (None, False)),
        ("<think>Up is best... and then", (None, False)),
        ("<think>Down</think> just Left", ("Left", False)),
        ("Thinking: Up?</think><answer>Down</answer>", ("Down", True)),
        ("<ANSWER>left</ANSWER>", ("Left", True)),
    ],
)
def test_parse_action(text: str, expected: tuple[str | None, bool]) -> None:
    assert tuple(parse_action(text, ACTIONS)) == expected


def test_think_words_never_count_as_actions() -> None:
    assert parse_action("<think>go Up</think>", ACTIONS) == (None, False)


def test_free_form_answers() -> None:
    assert parse_action("<answer> (3 + 5) * 2 </answer>", None) == ("(3 + 5) * 2", True)
    assert parse_action("(3 + 5) * 2", None) == (None, False)
    assert parse_action("<answer>  </answer>", None) == (None, False)


def test_config_options() -> None:
    no_fallback = ActionParseConfig(fallback_to_last_word=False)
    assert parse_action("go Up", ACTIONS, no_fallback) == (None, False)
    need_think = ActionParseConfig(require_think=True)
    assert parse_action("<answer>Up</answer>", ACTIONS, need_think) == ("Up", False)
    assert parse_action("<think>x</think><answer>Up</answer>", ACTIONS, need_think) == ("Up", True)
    keep_think = ActionParseConfig(strip_think=False)
    assert parse_action("<think>Up</think>", ACTIONS, keep_think) == ("Up", False)
    tag = ActionParseConfig(answer_tag="action")
    assert parse_action("<action>Down</action>", ACTIONS, tag) == ("Down", True)


def test_strip_think() -> None:
    assert strip_think("<think>a</think>b<think>c</think>d") == (" b d", True)
    assert strip_think("a<think>b") == ("a", False)
