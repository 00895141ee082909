"""Env calls past their deadline on real EnvWorker actors (no torch in them): an env that spins forever and one
that freezes its whole worker (a catastrophic regex holds the GIL, so not even the in-worker deadline can answer).

``tests/agentic/test_env_manager_timeout.py`` covers an env that sleeps (cut off inside the worker, the rest of
the batch trains); here the two cases that cut-off threads alone cannot end.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from ray import cloudpickle

from roll.agentic.env_manager.config import EnvEntryConfig, EnvManagerConfig
from roll.agentic.env_manager.manager import RolloutManager, group_plan
from roll.agentic.env_manager.slots import ResetRequest, StepRequest
from roll.agentic.env_manager.worker import ClusterEnvPool, EnvWorker, worker_kwargs
from roll.agentic.types import StepResult
from roll.core.cluster import Cluster
from roll.core.testing import tiny_role

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

SPIN, FREEZE = 7, 9
STEP_TIMEOUT_S, CALL_TIMEOUT_S = 1.0, 4.0


class TrickyEnv:
    """One-step env: a seed ending in SPIN spins in ``step`` (``while True: pass``), one ending in FREEZE runs a
    regex that never ends and never releases the GIL; any other seed answers at once with reward 1."""

    max_steps = 1
    system_prompt = "Pick. Valid actions: Left, Right"
    action_space_text = "Valid actions: Left, Right"

    def __init__(self) -> None:
        self.seed = 0

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.seed = seed or 0
        return f"seed {self.seed}", {}

    def step(self, action: str) -> StepResult:
        if self.seed % 10 == SPIN:
            while True:
                pass
        if self.seed % 10 == FREEZE:
            re.match(r"(a+)+$", "a" * 64 + "b")
        return StepResult("over", 1.0, True, False, {"success": True})

    def render(self, mode: str = "text") -> str:
        return ""

    def close(self) -> None:
        return None


def tricky(entry: int) -> TrickyEnv:
    return TrickyEnv()


@pytest.fixture
def pool(ray_local: Any) -> Iterator[ClusterEnvPool]:
    """2 env workers x 2 slots (slots 0-1 on rank 0, 2-3 on rank 1)."""
    kwargs = worker_kwargs([EnvEntryConfig(type="tricky")], 4, 2, STEP_TIMEOUT_S)
    role = tiny_role(num_workers=2)
    with Cluster("env_workers", EnvWorker, role, init_kwargs={**kwargs, "factory": tricky}) as cluster:
        yield ClusterEnvPool(cluster, kwargs["slots"], call_timeout_s=CALL_TIMEOUT_S)


def _reset(pool: ClusterEnvPool, seeds: list[int]) -> list[str | None]:
    return [o.error if o else "none" for o in pool.reset([ResetRequest(0, s) for s in seeds])]


def test_a_spinning_env_is_cut_off_and_its_worker_restarted_before_the_next_rollout(
    pool: ClusterEnvPool,
) -> None:
    """The spinning env's step times out at 1 s (the others step); its thread cannot be stopped, so the worker
    reports one leaked call and the next reset restarts rank 0 (a new process) and resets every slot."""
    pids = [info.pid for info in pool.cluster.infos]
    assert _reset(pool, [0, SPIN, 0, 0]) == [None] * 4
    started = time.monotonic()
    steps = pool.step([StepRequest("Left")] * 4)
    assert time.monotonic() - started < 20
    errors = [o.error if o else "none" for o in steps]
    assert errors[0] is None and errors[2:] == [None, None]
    assert errors[1] == "timeout: no answer within 1s (env cut off)"
    assert pool.cluster.leaked() == [1, 0]
    assert _reset(pool, [0, 0, 0, 0]) == [None] * 4
    assert pool.restarts == 1
    now = [info.pid for info in pool.cluster.infos]
    assert now[0] != pids[0] and now[1] == pids[1]
    assert pool.cluster.leaked() == [0, 0]


def test_a_worker_frozen_by_its_env_is_restarted_and_its_envs_time_out_with_the_reason(
    pool: ClusterEnvPool,
) -> None:
    """Rank 1's env holds the GIL for good: rank 1 cannot answer even its own 1 s deadline, so the pool's 4 s
    deadline ends the call; rank 1 is restarted and both its slots get a timeout naming rank and method, while
    rank 0's slots step normally. Before: the step waited for the role's call timeout (600 s) and then failed."""
    pids = [info.pid for info in pool.cluster.infos]
    assert _reset(pool, [0, 0, FREEZE, 0]) == [None] * 4
    started = time.monotonic()
    steps = pool.step([StepRequest("Left")] * 4)
    elapsed = time.monotonic() - started
    assert CALL_TIMEOUT_S <= elapsed < 60, elapsed
    assert [o.result.reward if o and o.result else None for o in steps[:2]] == [1.0, 1.0]
    for outcome in steps[2:]:
        assert outcome is not None and outcome.error is not None
        assert outcome.error.startswith("timeout: env worker rank 1 did not answer in time during step")
        assert outcome.error.endswith("restarted, its envs lost")
    assert pool.restarts == 1 and pool.cluster.infos[1].pid != pids[1]
    assert _reset(pool, [0, 0, 0, 0]) == [None] * 4  # the fresh worker serves the next rollout


def test_the_episode_of_a_frozen_env_ends_as_a_timeout_and_the_others_finish(pool: ClusterEnvPool) -> None:
    """Through the RolloutManager (scripted policy): 2 groups of 2, group 1's envs on the frozen rank 1. The
    rollout returns group 0's two finished episodes; group 1's end as timeouts with the reason."""
    from roll.agentic.env_manager.chat import ChatEncoder
    from roll.data.tokenizer import build_tokenizer

    encoder = ChatEncoder(build_tokenizer("roll-tiny"))
    config = EnvManagerConfig(envs=[EnvEntryConfig(type="tricky")], step_timeout_s=STEP_TIMEOUT_S)

    def answer(prompts: list[list[int]], *, seed: int, **_: Any) -> list[Any]:
        from roll.agentic.env_manager.manager import Generation

        ids = [*encoder.encode("<answer>Left</answer>"), encoder.eos_token_id]
        return [Generation(ids, [-0.5] * len(ids)) for _ in prompts]

    def ends(plan: list[tuple[int, int]]) -> list[int]:
        return [seed % 10 for _, seed in plan]

    # the first batch seed whose group 0 steps normally and whose group 1 (slots 2-3, rank 1) freezes
    batch_seed = next(
        b
        for b in range(10_000)
        if ends(plan := group_plan(config, 2, 2, b))[2] == FREEZE and ends(plan)[0] not in (SPIN, FREEZE)
    )
    manager = RolloutManager(config, pool, answer, encoder, max_new_tokens=32)
    rollout = manager.rollout(num_groups=2, group_size=2, batch_seed=batch_seed)
    statuses = [(e.status, e.error or "") for e in rollout.started]
    assert [s for s, _ in statuses] == ["done", "done", "timeout", "timeout"]
    assert all("env worker rank 1 did not answer in time" in why for _, why in statuses[2:])
    assert len(rollout.episodes) == 2 and rollout.metrics()["env/timeouts"] == 2.0
