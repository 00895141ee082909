"""Built-in tasks: deterministic, correct (checked by an independent evaluator), disjoint splits, sane pairs."""

from __future__ import annotations

import random
import re

import pytest

from roll.core.errors import DataError
from roll.data.tasks import (
    ArithmeticTask,
    CompareTask,
    builtin_dataset,
    get_task,
    preference_dataset,
    problems,
    register_task,
    rl_dataset,
    sft_dataset,
    task_names,
)
from roll.data.tasks.arithmetic import evaluate, extract_answer

_PROMPT = re.compile(r"What is ([0-9+\-*()]+)\?")


def _independent_value(prompt: str) -> int:
    """Python's own evaluator on a prompt whose characters were checked to be digits, + - * and parentheses."""
    match = _PROMPT.fullmatch(prompt)
    assert match is not None, prompt
    return int(eval(match.group(1), {"__builtins__": {}}, {}))


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5, 6])
def test_arithmetic_answers_are_correct(level: int) -> None:
    task = ArithmeticTask.level(level)
    for problem in problems(task, 100, seed=3):
        assert int(problem.answer) == _independent_value(problem.prompt)
        assert problem.ground_truth == problem.answer
        assert problem.tag == "arithmetic"


def test_levels_use_their_operators_and_parentheses() -> None:
    prompts = [p.prompt for p in problems(ArithmeticTask.level(5), 200, seed=0)]
    assert any("(" in p for p in prompts)
    assert any("*" in p for p in prompts)
    assert not any("*" in p for p in (q.prompt for q in problems(ArithmeticTask.level(2), 200, seed=0)))
    two_digit = [int(x) for p in problems(ArithmeticTask.level(2), 50) for x in re.findall(r"\d+", p.prompt)]
    assert all(10 <= x <= 99 for x in two_digit)


def test_deterministic_by_seed_and_different_across_seeds() -> None:
    task = get_task("arithmetic")
    first = sft_dataset(task, 50, seed=7).to_list()
    assert first == sft_dataset(task, 50, seed=7).to_list()
    assert first != sft_dataset(task, 50, seed=8).to_list()


def test_train_and_eval_share_no_problem_across_seeds() -> None:
    task = get_task("arithmetic")
    train = {p.key for seed in range(3) for p in problems(task, 500, seed=seed, split="train")}
    held_out = {p.key for seed in range(3) for p in problems(task, 200, seed=seed, split="eval")}
    assert held_out and not train & held_out


def test_problems_are_distinct_and_too_many_raises() -> None:
    keys = [p.key for p in problems(get_task("arithmetic", level=1), 150)]
    assert len(keys) == len(set(keys))
    with pytest.raises(DataError, match="found only"):
        problems(get_task("arithmetic", level=1), 1000)


def test_sft_rows_teach_the_format_verify_accepts() -> None:
    task = get_task("arithmetic")
    for row in sft_dataset(task, 20).to_list():
        user, assistant = row["messages"]
        assert user["role"] == "user" and assistant["role"] == "assistant"
        assert assistant["content"] == f"The answer is {row['ground_truth']}."
        assert task.verify(assistant["content"], row["ground_truth"])
        assert row["tag"] == "arithmetic"


def test_preference_chosen_is_right_and_rejected_is_wrong() -> None:
    for task in (get_task("arithmetic"), get_task("arithmetic", level=1), get_task("compare")):
        for row in preference_dataset(task, 100, seed=1).to_list():
            chosen, rejected = row["chosen"][0]["content"], row["rejected"][0]["content"]
            assert chosen != rejected
            assert task.verify(chosen, row["ground_truth"])
            assert not task.verify(rejected, row["ground_truth"])
            assert row["prompt"][0]["role"] == "user"


def test_rl_rows_carry_prompt_ground_truth_and_tag() -> None:
    rows = rl_dataset(get_task("arithmetic"), 10, split="eval").to_list()
    assert len(rows) == 10
    for row in rows:
        assert row["messages"] == [{"role": "user", "content": row["prompt"]}]
        assert int(row["ground_truth"]) == _independent_value(row["prompt"])
        assert row["tag"] == "arithmetic"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("The answer is 68.", "68"),
        ("the answer is -12", "-12"),
        ("12+3 is 15, so the answer is 15. Done 7", "15"),
        ("I think 41", "41"),
        ("no idea", None),
    ],
)
def test_extract_answer(response: str, expected: str | None) -> None:
    assert extract_answer(response) == expected


def test_verify_compares_by_value() -> None:
    task = get_task("arithmetic")
    assert task.verify("The answer is 068.", "68")
    assert not task.verify("The answer is 67.", "68")
    assert not task.verify("", "68")


def test_evaluate_refuses_anything_but_arithmetic() -> None:
    assert evaluate("2-(3*4)+-1") == -11
    for bad in ("2/3", "__import__('os')", "2**8", "1+"):
        with pytest.raises(DataError):
            evaluate(bad)


def test_compare_answers_are_correct() -> None:
    for p in problems(CompareTask(), 100):
        a, b = (int(x) for x in re.findall(r"\d+", p.prompt))
        assert int(p.answer) == max(a, b)
    smaller = CompareTask(smaller=True).sample(random.Random(0))
    assert int(smaller.answer) == min(int(x) for x in re.findall(r"\d+", smaller.prompt))


def test_registry() -> None:
    assert {"arithmetic", "compare"} <= set(task_names())
    assert get_task("builtin:arithmetic") == ArithmeticTask()
    with pytest.raises(DataError, match="known tasks: arithmetic, compare"):
        get_task("sudoku")
    with pytest.raises(DataError, match="already registered"):
        register_task("arithmetic", ArithmeticTask)
    with pytest.raises(DataError, match="bad options"):
        get_task("arithmetic", colour="red")
    with pytest.raises(DataError, match="unknown arithmetic level"):
        get_task("arithmetic", level=9)


def test_builtin_dataset_by_spec() -> None:
    rows = builtin_dataset("builtin:arithmetic", "sft", 5, options={"level": 3}).to_list()
    assert len(rows) == 5 and "messages" in rows[0]
    with pytest.raises(DataError, match="unknown dataset kind"):
        builtin_dataset("arithmetic", "dpo", 5)  # type: ignore[arg-type]
