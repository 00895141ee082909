"""Each IFEval checker with one response that follows the instruction and one that does not."""

from __future__ import annotations

from typing import Any

import pytest

from roll.pipelines.rewards.config import IFEvalRewardConfig
from roll.pipelines.rewards.ifeval import CHECKERS, IFEvalReward, check
from roll.pipelines.rewards.types import RewardRequest

# (id, kwargs, passing response, failing response)
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("length_constraints:number_words", {"relation": "at least", "num_words": 3}, "one two three", "one two"),
    (
        "length_constraints:number_words",
        {"relation": "less than", "num_words": 3},
        "one two",
        "one two three",
    ),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First.\n***\nSecond.", "Only one."),
    ("keywords:existence", {"keywords": ["apple", "pear"]}, "An Apple and a pear.", "An apple only."),
    ("keywords:forbidden_words", {"forbidden_words": ["bad"]}, "All good here.", "That is Bad."),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "at least"}, "cat cat", "one cat"),
    ("change_case:english_lowercase", {}, "all lower case.", "Not all lower."),
    ("change_case:english_capital", {}, "ALL CAPS HERE.", "NOT all caps."),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done. Any other questions?", "Done."),
    ("startend:start_checker", {"start_phrase": "Dear Sir"}, "Dear sir, hello.", "Hello, Dear Sir."),
    ("startend:quotation", {}, '"wrapped in quotes"', "not wrapped"),
    ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', "{'a': 1,}"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n* two", "* one\n* two\n- three"),
    ("detectable_format:title", {}, "<<My Title>>\nbody", "My Title\nbody"),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "SECTION 1\na\nSECTION 2\nb",
        "SECTION 1\na",
    ),
    (
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "Send to [name] at [address].",
        "Send to [name].",
    ),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\nP.S. bye", "Hi. bye"),
    ("punctuation:no_comma", {}, "No commas here.", "Yes, one comma."),
    ("language:response_language", {"language": "en"}, "Plain English text.", "Привет, как дела?"),
]


@pytest.mark.parametrize(("instruction", "kwargs", "good", "bad"), CASES, ids=[c[0] for c in CASES])
def test_checker_pass_and_fail(instruction: str, kwargs: dict[str, Any], good: str, bad: str) -> None:
    assert check(instruction, good, kwargs) is True
    assert check(instruction, bad, kwargs) is False


def test_every_checker_is_covered() -> None:
    assert {c[0] for c in CASES} == set(CHECKERS)


def test_score_is_fraction_followed_in_both_metadata_layouts() -> None:
    response = "hello world, all lower"
    ours = {
        "instructions": [
            {"id": "change_case:english_lowercase"},
            {"id": "punctuation:no_comma", "kwargs": {}},
        ]
    }
    ifeval_rows = {
        "instruction_id_list": ["change_case:english_lowercase", "punctuation:no_comma"],
        "kwargs": [{"num_words": None}, {}],  # IFEval rows carry null-valued unused arguments
    }
    results = IFEvalReward().score(
        [RewardRequest(response, metadata=ours), RewardRequest(response, metadata=ifeval_rows)]
    )
    assert [r.score for r in results] == [0.5, 0.5]
    assert results[0].info["followed"] == {
        "change_case:english_lowercase": True,
        "punctuation:no_comma": False,
    }
    strict = IFEvalReward(IFEvalRewardConfig(all_or_nothing=True)).score(
        [RewardRequest(response, metadata=ours)]
    )
    assert strict[0].score == 0.0


def test_unknown_id_and_bad_kwargs_score_zero_with_error() -> None:
    unknown = RewardRequest("x", metadata={"instructions": [{"id": "nope:nothing"}]})
    bad_kwargs = RewardRequest(
        "x", metadata={"instructions": [{"id": "punctuation:no_comma", "kwargs": {"n": 1}}]}
    )
    bad_relation = RewardRequest(
        "x",
        metadata={
            "instructions": [
                {"id": "length_constraints:number_words", "kwargs": {"relation": "about", "num_words": 1}}
            ]
        },
    )
    results = IFEvalReward().score([unknown, bad_kwargs, bad_relation, RewardRequest("x")])
    assert all(r.score == 0.0 and "error" in r.info for r in results)
    assert "known:" in results[0].info["error"]
