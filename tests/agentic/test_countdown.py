"""Countdown: answer checking, solvable generation, and the calculator tool in the loop."""

from __future__ import annotations

import pytest

from roll.agentic.envs.countdown import CountdownConfig, CountdownEnv, check_expression, make_countdown
from roll.agentic.tools.wrapper import ToolEnvWrapper
from roll.agentic.types import Env


@pytest.mark.parametrize(
    ("expr", "ok"),
    [
        ("(25 - 5) * 3", True),
        ("3 * (25 - 5)", True),
        ("25 * 3 - 5 * 3", False),  # 3 used twice
        ("60", False),  # 60 is not a number given
        ("(25 - 5) * 3 + 0", False),
        ("20 * 3", False),
        ("(25 - 5) ** 1 * 3", False),
        ("-(5 - 25) * 3", False),
        ("__import__('os')", False),
        ("(25 - 5) * 3.0", False),
    ],
)
def test_check_expression(expr: str, ok: bool) -> None:
    assert check_expression(expr, [25, 5, 3], 60)[0] is ok


def test_exact_rational_arithmetic() -> None:
    assert check_expression("8 / 3 * 3", [8, 3, 3], 8)[0]


def test_generated_problems_are_solvable() -> None:
    env = CountdownEnv()
    for seed in range(50):
        _, info = env.reset(seed=seed)
        assert check_expression(info["solution"], info["numbers"], info["target"]) == (True, "correct")
    assert CountdownEnv().reset(seed=1)[0] == CountdownEnv().reset(seed=1)[0]


def test_rewards_and_termination() -> None:
    env = CountdownEnv(CountdownConfig(max_steps=2))
    _, info = env.reset(seed=0)
    no_answer = env.step("I am thinking")
    assert not no_answer.done and no_answer.info["format_ok"] is False
    right = env.step(f"<think>easy</think><answer>{info['solution']}</answer>")
    assert right.reward == 1.0 and right.terminated and right.info["success"]

    env.reset(seed=0)
    wrong = env.step("<answer>1 + 1</answer>")
    assert wrong.reward == 0.0 and wrong.terminated and not wrong.info["success"]

    env.reset(seed=0)
    env.step("hmm")
    assert env.step("still hmm").truncated


def test_make_countdown_offers_a_calculator() -> None:
    env = make_countdown(CountdownConfig())
    assert isinstance(env, ToolEnvWrapper) and isinstance(env, Env)
    assert "calculator" in env.system_prompt and "<tool_call>" in env.system_prompt
    _, info = env.reset(seed=3)
    call = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>')
    assert call.observation == "<tool_response>\n42\n</tool_response>" and not call.done
    final = env.step(f"<answer>{info['solution']}</answer>")
    assert final.reward == 1.0 and final.terminated
    assert isinstance(make_countdown(CountdownConfig(use_calculator=False)), CountdownEnv)
