"""GenerateScheduler and RewardScheduler against real Ray actors (small Worker subclasses, no model).

``Rollout`` stands in for an inference worker: ``generate`` returns ``G`` rows per prompt stamped with the
worker's policy version, ``update_weights`` bumps it. Its ``score`` stands in for a reward worker: the reward of
sample ``g`` of prompt ``x`` is ``(x + g) % 2`` for odd ``x`` (a mixed group) and ``1`` for even ``x`` (all
equal, which dynamic sampling drops). One 2-rank cluster plays both roles (Ray runs an actor's calls in order,
so the two kinds interleave correctly); a 1-rank cluster is the second reward domain of the routing test.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster, Dispatch, Worker, WorkerContext, register
from roll.core.errors import WorkerTimeoutError
from roll.core.scheduler import ColumnRows, GenerateOptions, GenerateScheduler, RankRequest, RewardScheduler
from roll.core.seeding import TRAIN_STREAM, derive_seed
from roll.core.testing import tiny_role

G = 4


class Rollout(Worker):
    def __init__(
        self, ctx: WorkerContext, bonus: float = 0.0, delay_s: float = 0.0, slow_below: int = 0
    ) -> None:
        super().__init__(ctx)
        self.version = 0
        self.bonus = bonus
        self.delay_s = delay_s
        self.slow_below = slow_below  # prompts x < slow_below take 1 s more: their request finishes last

    @register(Dispatch.DP_SPLIT)
    def generate(self, prompts: Batch, n: int) -> Batch:
        x_P = prompts["x_P"]
        time.sleep(self.delay_s + (1.0 if int(x_P.min()) < self.slow_below else 0.0))
        rows = x_P.repeat_interleave(n)
        out = Batch(
            {
                "x_B": rows,
                "g_B": torch.arange(n).repeat(len(x_P)),
                "policy_version_B": torch.full((len(rows),), self.version),
                "rank_B": torch.full((len(rows),), self.rank),
            }
        )
        if C.PROMPT_SEED in prompts:  # echo each prompt's seed on its samples, for the seeding test
            out[C.PROMPT_SEED] = prompts[C.PROMPT_SEED].repeat_interleave(n)
        return out

    @register(Dispatch.ONE_TO_ALL)
    def update_weights(self, version: int) -> None:
        self.version = version

    @register(Dispatch.DP_SPLIT)
    def score(self, batch: Batch) -> Batch:
        x_B, g_B = batch["x_B"], batch["g_B"]
        reward_B = torch.where(x_B % 2 == 1, ((x_B + g_B) % 2).float(), torch.ones_like(x_B).float())
        return Batch({"reward_B": reward_B + self.bonus})

    @register(Dispatch.RANK_ZERO)
    def score_rows(self, rows: dict[str, list[Any]]) -> dict[str, list[float]]:
        """A light reward worker's view: plain lists in, plain lists out (no Batch, so no torch needed)."""
        assert all(isinstance(v, list) for v in rows.values()), rows
        return {"reward_B": [len(tag) * 10.0 + x for x, tag in zip(rows["x_B"], rows["tag"])]}


@pytest.fixture(scope="module")
def rollout(ray_local: Any) -> Iterator[Cluster]:
    with Cluster("rollout", Rollout, tiny_role(num_workers=2), init_args=(0.0, 0.05)) as cluster:
        yield cluster


class Counter:
    """A prompt source: consecutive integers from ``start``; tags alternate between ``a`` and ``b``."""

    def __init__(self, start: int = 0) -> None:
        self.next = itertools.count(start)

    def __call__(self, n: int) -> Batch:
        xs = [next(self.next) for _ in range(n)]
        return Batch({"x_P": torch.tensor(xs)}, {"tag": ["a" if x % 2 else "b" for x in xs]})


def drop_all_equal(scored: Batch, group_size: int) -> tuple[torch.Tensor, Mapping[str, float]]:
    rewards_PG = scored["reward_B"].reshape(-1, group_size)
    keep_P = ~(rewards_PG == rewards_PG[:, :1]).all(-1)
    return keep_P, {"all_equal": float((~keep_P).sum())}


def generating(cluster: Cluster, n: int = G) -> RankRequest[Batch]:
    """``Rollout.generate`` with ``n`` samples per prompt bound: what the generate scheduler sends each rank."""
    return RankRequest.bind(cluster.method(Rollout.generate), n)


def scoring(cluster: Cluster) -> RankRequest[Batch]:
    return RankRequest.bind(cluster.method(Rollout.score))


def make(rollout: Cluster, start: int = 0, **options: Any) -> GenerateScheduler:
    opts = GenerateOptions(**{"group_size": G, "request_prompts": 2, "carry_columns": ("tag",), **options})
    scorer = RewardScheduler({"r": scoring(rollout)}, {"a": "r", "b": "r"})
    return GenerateScheduler(generating(rollout), Counter(start), opts, scorer=scorer)


def seeds_by_prompt(batch: Batch) -> dict[int, int]:
    return dict(zip(batch["x_B"].tolist(), batch[C.PROMPT_SEED].tolist()))


def test_prompt_seeds_follow_the_feed_and_continue_after_a_resume(rollout: Cluster) -> None:
    """With ``seed=7`` the ``n``-th prompt drawn (here prompt ``x = n``) is sent with ``derive_seed(7, 0, n)``,
    whichever request and rank carried it; a scheduler restored from the first one's ``state_dict`` after step 1
    (and a source resumed at prompt 6) sends step 2's prompts with the seeds the uninterrupted one sent."""
    with make(rollout, seed=7) as first:
        step1 = first.get_batch(6, trainer_version=0).batch
        state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint keeps
        step2 = first.get_batch(6, trainer_version=0).batch
    assert seeds_by_prompt(step1) == {x: derive_seed(7, TRAIN_STREAM, x) for x in range(6)}
    with make(rollout, start=6, seed=7) as resumed:
        resumed.load_state_dict(state)
        again = resumed.get_batch(6, trainer_version=0).batch
    assert (
        seeds_by_prompt(again)
        == seeds_by_prompt(step2)
        == {x: derive_seed(7, TRAIN_STREAM, x) for x in range(6, 12)}
    )
    assert resumed.state()["rollout/prompts_generated"] == 12


def test_without_a_seed_no_prompt_seed_is_sent(rollout: Cluster) -> None:
    with make(rollout) as scheduler:
        assert C.PROMPT_SEED not in scheduler.get_batch(2, trainer_version=0).batch


def test_sync_batch_is_whole_groups_from_many_requests_on_both_ranks(rollout: Cluster) -> None:
    with make(rollout) as scheduler:
        out = scheduler.get_batch(8, trainer_version=0)
    batch = out.batch
    assert len(batch) == 8 * G
    x_PG = batch["x_B"].reshape(8, G)
    assert (x_PG == x_PG[:, :1]).all()  # prompt-major groups
    assert sorted(x_PG[:, 0].tolist()) == list(range(8))
    assert "reward_B" in batch and list(batch["tag"][:G]) == ["b"] * G  # scored, carried columns
    assert out.metrics["rollout/requests"] == 4
    assert set(batch["rank_B"].tolist()) == {0, 1}
    assert out.versions == [0] * 8


def test_sync_batch_keeps_feed_order_when_requests_finish_out_of_order(ray_local: Any) -> None:
    """Request 0 (prompts 0, 1) is the slowest, so requests 1-3 finish before it (both ranks stay busy); the batch
    must still be prompts 0..7 in feed order, or two runs' batches (micro-batches, float sums) would differ."""
    role = tiny_role(num_workers=2)
    slow = Cluster("rollout_slow", Rollout, role, init_args=(0.0, 0.0, 2))
    with slow, make(slow) as scheduler:
        batch = scheduler.get_batch(8, trainer_version=0).batch
    assert batch["x_B"].tolist() == [x for x in range(8) for _ in range(G)]


def test_dynamic_sampling_fills_the_batch_and_counts_drops(rollout: Cluster) -> None:
    with make(rollout, max_rounds=6) as scheduler:
        scheduler.group_filter = drop_all_equal
        out = scheduler.get_batch(6, trainer_version=0)
    x_P = out.batch["x_B"].reshape(6, G)[:, 0]
    assert (x_P % 2 == 1).all(), "every kept group has mixed rewards"
    assert out.metrics["rollout/groups_dropped"] >= 6
    assert out.metrics["rollout/rounds"] >= 2
    assert out.metrics["rollout/filter_all_equal"] >= 6
    assert out.metrics["rollout/groups_filled"] == 0


def test_bounded_retries_fill_with_dropped_groups(rollout: Cluster) -> None:
    def drop_everything(scored: Batch, group_size: int) -> tuple[torch.Tensor, Mapping[str, float]]:
        return torch.zeros(len(scored) // group_size, dtype=torch.bool), {}

    with make(rollout, max_rounds=2) as scheduler:
        scheduler.group_filter = drop_everything
        out = scheduler.get_batch(4, trainer_version=0)
    assert len(out.batch) == 4 * G
    assert out.metrics["rollout/rounds"] == 2
    assert out.metrics["rollout/groups_filled"] == 4


def test_sync_mode_version_equals_trainer_after_every_sync(rollout: Cluster) -> None:
    with make(rollout) as scheduler:
        for version in range(3):
            rollout.update_weights(version)
            out = scheduler.get_batch(4, trainer_version=version)
            assert set(out.batch["policy_version_B"].tolist()) == {version}
    rollout.update_weights(0)


def test_async_never_trains_on_samples_staler_than_the_bound(rollout: Cluster) -> None:
    lags: list[int] = []
    with make(rollout, async_ratio=1.0) as scheduler:
        for version in range(5):
            out = scheduler.get_batch(4, trainer_version=version)
            lag_B = version - out.batch["policy_version_B"]
            assert int(lag_B.max()) <= 1, f"step {version}: lag {lag_B.tolist()}"
            lags += lag_B.tolist()
            time.sleep(0.3)  # "training": the thread generates the next step meanwhile
            rollout.update_weights(version + 1)
        stats = scheduler.state()
    rollout.update_weights(0)
    assert 1 in lags, "async generation ran ahead (some samples came from the previous policy)"
    assert stats["rollout/prompts_generated"] >= 20


def test_async_steady_run_evicts_nothing_and_counts_each_steps_prompts(rollout: Cluster) -> None:
    """Ratio 1, bound 1, ``n = 4``: while step ``v`` "trains" the thread runs exactly 4 groups ahead on version
    ``v``, which step ``v + 1`` takes (lag 1), so no group is evicted as stale; and each step's
    ``prompts_generated`` is the 4 prompts that came back since the previous batch (step 0 also sees some of
    the 4 the thread sent for step 1 at the start). How many of those running ahead are back when a batch is
    handed out depends on the machine's load, so the counts are checked cumulatively: by step ``k`` at least the
    ``4 (k + 1)`` prompts handed out and at most ``4 (k + 2)`` (one step's worth ahead) have been counted."""
    with make(rollout, async_ratio=1.0) as scheduler:
        metrics = []
        for version in range(5):
            out = scheduler.get_batch(4, trainer_version=version)
            metrics.append(out.metrics)
            time.sleep(0.3)  # "training": the four groups ahead come back meanwhile
            rollout.update_weights(version + 1)
        stats = scheduler.state()
    rollout.update_weights(0)
    assert [m["rollout/groups_stale"] for m in metrics] == [0.0] * 5
    counted = list(itertools.accumulate(m["rollout/prompts_generated"] for m in metrics))
    for k, total in enumerate(counted):
        assert 4 * (k + 1) <= total <= 4 * (k + 2), f"after step {k}: {counted}"
    # every prompt counted in a step, plus those of the 4 running ahead that came back before state() was read
    assert counted[-1] <= stats["rollout/prompts_generated"] <= counted[-1] + 4
    assert 20 <= stats["rollout/prompts_generated"] <= 24


def test_idle_async_thread_does_not_spin(rollout: Cluster) -> None:
    """With the buffer full and nothing in flight the generation thread sleeps on a condition: the driver
    process spends under 0.1 s of CPU over a 1 s "training" window (a spinning thread spends ~0.9 s)."""
    with make(rollout, async_ratio=1.0) as scheduler:
        scheduler.get_batch(4, trainer_version=0)
        time.sleep(0.5)  # the four groups ahead come back; then there is nothing to do
        cpu0, wall0 = time.process_time(), time.perf_counter()
        time.sleep(1.0)
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    assert cpu_s < 0.1 * wall_s, f"idle generation thread used {cpu_s:.2f} s of CPU in {wall_s:.2f} s"


def test_async_with_zero_staleness_generates_nothing_ahead(rollout: Cluster) -> None:
    """``max_staleness=0``: a group made while the trainer trains would be stale at the next step, so the
    thread makes none; the next batch is generated on the new weights."""
    with make(rollout, async_ratio=1.0, max_staleness=0) as scheduler:
        scheduler.get_batch(4, trainer_version=0)
        time.sleep(0.5)
        generated = scheduler.state()["rollout/prompts_generated"]
        time.sleep(0.3)
        assert scheduler.state()["rollout/prompts_generated"] == generated
        rollout.update_weights(1)
        out = scheduler.get_batch(4, trainer_version=1)
    rollout.update_weights(0)
    assert set(out.batch["policy_version_B"].tolist()) == {1}
    assert out.metrics["rollout/groups_stale"] == 0


def test_async_evicts_groups_staler_than_the_bound(rollout: Cluster) -> None:
    """The bound still holds when the trainer skips a version: the 4 groups made ahead on version 0 lag 2 at
    trainer version 2 and are evicted; the batch comes from version 2."""
    with make(rollout, async_ratio=1.0) as scheduler:
        scheduler.get_batch(4, trainer_version=0)
        time.sleep(0.5)  # four version-0 groups wait in the buffer
        rollout.update_weights(2)
        out = scheduler.get_batch(4, trainer_version=2)
    rollout.update_weights(0)
    assert set(out.batch["policy_version_B"].tolist()) == {2}
    assert out.metrics["rollout/groups_stale"] == 4


def test_generate_all_keeps_prompt_order(rollout: Cluster) -> None:
    scheduler = make(rollout)
    prompts = Batch({"x_P": torch.arange(7)}, {"tag": ["a"] * 7})
    out = scheduler.generate_all(prompts, generating(rollout, 2))
    assert out["x_B"].tolist() == torch.arange(7).repeat_interleave(2).tolist()
    assert list(out["tag"]) == ["a"] * 7 * 2
    assert len(scheduler.generate_all(prompts)) == 7 * G  # the scheduler's own request: G per prompt


def test_reward_scheduler_routes_tags_to_domains_and_keeps_order(rollout: Cluster, ray_local: Any) -> None:
    with Cluster("reward_b", Rollout, tiny_role(), init_args=(10.0,)) as other:
        rewards = RewardScheduler(
            {"main": scoring(rollout), "other": scoring(other)}, {"a": "main", "b": "other"}
        )
        x_B = torch.arange(10)
        batch = Batch({"x_B": x_B, "g_B": torch.zeros(10, dtype=torch.long)}, {"tag": ["a", "b"] * 5})
        scored = rewards.score(batch)
    assert scored["x_B"].tolist() == x_B.tolist()
    bonus_B = scored["reward_B"] >= 10
    assert bonus_B.tolist() == [tag == "b" for tag in scored["tag"]]


def test_reward_scheduler_sends_plain_columns_to_light_workers(rollout: Cluster) -> None:
    """``columns=("x_B", "tag")``: each rank gets plain lists of those columns only and its list answer comes back
    as a float32 column in input order. Golden: reward = 10 * len(tag) + x, so rows 0..5 tagged "a" or "bb"."""
    score_rows = RankRequest.bind(rollout.method(Rollout.score_rows))
    rewards = RewardScheduler({"r": score_rows}, {"a": "r", "bb": "r"}, columns=("x_B", "tag"))
    batch = Batch({"x_B": torch.arange(6), "g_B": torch.zeros(6)}, {"tag": ["a", "bb"] * 3})
    scored = rewards.score(batch)
    assert scored["reward_B"].dtype == torch.float32
    assert scored["reward_B"].tolist() == [10.0, 21.0, 12.0, 23.0, 14.0, 25.0]
    assert scored["g_B"].tolist() == [0.0] * 6  # the input's columns stay


def test_reward_scheduler_names_an_unrouted_tag(rollout: Cluster) -> None:
    rewards = RewardScheduler({"main": scoring(rollout)}, {"a": "main"})
    with pytest.raises(ValueError, match="no reward domain for tag 'zzz'"):
        rewards.submit(Batch({"x_B": torch.arange(1)}, {"tag": ["zzz"]}))


class CrashOnce(Worker):
    """A reward worker whose process dies (``os._exit``, as a segfaulting verifier would) on its first call ever:
    the marker file makes the restarted actor score normally."""

    def __init__(self, ctx: WorkerContext, marker: str) -> None:
        super().__init__(ctx)
        self.marker = Path(marker)

    @register(Dispatch.DP_SPLIT)
    def score(self, batch: Batch) -> Batch:
        if not self.marker.exists():
            self.marker.touch()
            os._exit(1)
        return Batch({"reward_B": batch["x_B"].float() * 2})


def test_a_crashed_reward_worker_is_restarted_and_its_rows_retried(
    ray_local: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Golden: reward = 2x for x = 0..5 and 6..9, in input order. Both jobs were sent to the rank before it died;
    the first one's retry restarts it, the second one's finds it already replaced: one restart, 10 rows re-sent."""
    with Cluster("reward_crashy", CrashOnce, tiny_role(), init_args=(str(tmp_path / "crashed"),)) as crashy:
        first_pid = crashy.infos[0].pid
        rewards = RewardScheduler(
            {"main": RankRequest.bind(crashy.method(CrashOnce.score))}, {"a": "main"}, max_retries=1
        )
        jobs = [
            rewards.submit(Batch({"x_B": torch.arange(lo, hi)}, {"tag": ["a"] * (hi - lo)}))
            for lo, hi in ((0, 6), (6, 10))
        ]
        with caplog.at_level(logging.WARNING, logger="roll.core.scheduler.reward"):
            scored = [job.result()["reward_B"].tolist() for job in jobs]
        assert crashy.infos[0].pid != first_pid  # a new process
    assert scored == [[0.0, 2.0, 4.0, 6.0, 8.0, 10.0], [12.0, 14.0, 16.0, 18.0]]
    assert rewards.retried_requests == 10 and rewards.restarts == 1
    assert "reward_crashy rank 0 died while scoring 6 rows" in caplog.text


def test_reward_scheduler_sends_untagged_rows_to_the_only_domain(rollout: Cluster) -> None:
    rewards = RewardScheduler({"main": scoring(rollout)}, {"a": "main"})
    assert rewards.domain_of("") == "main"
    scored = rewards.score(
        Batch({"x_B": torch.arange(3), "g_B": torch.zeros(3, dtype=torch.long)}, {"tag": [""] * 3})
    )
    assert scored["x_B"].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="no reward domain for tag 'zzz'"):
        rewards.domain_of("zzz")  # a tag that is set but wrong is still an error


class HangOn(Worker):
    """A light reward worker whose ``score_rows`` never returns (``time.sleep(1e9)``, as a stuck verifier would)
    when its share holds ``x == hang_x``; otherwise reward = 2x."""

    def __init__(self, ctx: WorkerContext, hang_x: int) -> None:
        super().__init__(ctx)
        self.hang_x = hang_x

    @register(Dispatch.RANK_ZERO)
    def score_rows(self, rows: dict[str, list[Any]]) -> dict[str, list[float]]:
        if self.hang_x in rows["x_B"]:
            time.sleep(1e9)
        return {"reward_B": [2.0 * x for x in rows["x_B"]], "err_B": [0.0] * len(rows["x_B"])}


def hang_rows(cluster: Cluster) -> RankRequest[ColumnRows]:
    return RankRequest.bind(cluster.method(HangOn.score_rows))


def failed(domain: str, n: int, reason: str) -> dict[str, list[float]]:
    FAILED_REASONS.append(f"{domain}: {reason}")
    return {"reward_B": [-1.0] * n, "err_B": [1.0] * n}


FAILED_REASONS: list[str] = []
HANG_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def hanging(ray_local: Any) -> Iterator[Cluster]:
    """2 ranks; a share holding x == 3 hangs; the role's call deadline is HANG_TIMEOUT_S."""
    role = tiny_role(num_workers=2, call_timeout_s=HANG_TIMEOUT_S)
    with Cluster("reward_hang", HangOn, role, init_args=(3,), start_timeout_s=60.0) as cluster:
        yield cluster


def test_a_hung_reward_share_is_abandoned_its_rank_restarted_and_its_rows_failed(
    hanging: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """x = 0..5 split over 2 ranks: [0, 1, 2] scores 2x, [3, 4, 5] hangs. Past the 3 s deadline its rows get
    ``on_timeout``'s columns (reward -1, err 1) with a reason naming role, rank and deadline, its rank is a new
    process, and that rank scores the next batch. Without ``on_timeout`` the timeout is raised."""
    FAILED_REASONS.clear()
    pids = [info.pid for info in hanging.infos]
    rewards = RewardScheduler({"r": hang_rows(hanging)}, {"a": "r"}, columns=("x_B",), on_timeout=failed)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="roll.core.scheduler.reward"):
        scored = rewards.score(Batch({"x_B": torch.arange(6)}, {"tag": ["a"] * 6}))
    elapsed = time.monotonic() - started
    assert scored["reward_B"].tolist() == [0.0, 2.0, 4.0, -1.0, -1.0, -1.0]
    assert scored["err_B"].tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert HANG_TIMEOUT_S <= elapsed < 60, elapsed
    assert rewards.timed_out_rows == 3 and rewards.restarts == 1
    hung_rank = 1 if hanging.infos[0].pid == pids[0] else 0
    assert hanging.infos[hung_rank].pid != pids[hung_rank]
    assert [
        f"r: reward_hang rank {hung_rank}: score_rows of 3 rows did not answer within 3s (the reward role's "
        "call_timeout_s); the call was abandoned and the worker restarted"
    ] == FAILED_REASONS
    assert FAILED_REASONS[0].removeprefix("r: ") in caplog.text
    again = rewards.score(Batch({"x_B": torch.arange(10, 14)}, {"tag": ["a"] * 4}))
    assert again["reward_B"].tolist() == [20.0, 22.0, 24.0, 26.0]
    strict = RewardScheduler({"r": hang_rows(hanging)}, {"a": "r"}, columns=("x_B",))
    with pytest.raises(WorkerTimeoutError, match=r"reward_hang rank \d: score_rows did not answer within 3s"):
        strict.score(Batch({"x_B": torch.tensor([3])}, {"tag": ["a"]}))


def test_the_generate_scheduler_reads_a_hung_scoring_job_at_its_deadline(
    rollout: Cluster, hanging: Cluster
) -> None:
    """Before: the scheduler waited on the job's refs and read it only once ready, so a hung share held the
    step forever. Now the step ends after about the deadline: prompts 0..3 (requests [0, 1], [2, 3]; each
    request's 8 rows split 4/4 over the 2 reward ranks), and the share holding prompt 3's rows fails."""
    rewards = RewardScheduler(
        {"r": hang_rows(hanging)}, {"a": "r", "b": "r"}, columns=("x_B",), on_timeout=failed
    )
    opts = GenerateOptions(group_size=G, request_prompts=2, carry_columns=("tag",))
    started = time.monotonic()
    with GenerateScheduler(generating(rollout), Counter(0), opts, scorer=rewards) as scheduler:
        batch = scheduler.get_batch(4, trainer_version=0).batch
    elapsed = time.monotonic() - started
    x_PG = batch["x_B"].reshape(4, G)
    err_by_prompt = dict(zip(x_PG[:, 0].tolist(), batch["err_B"].reshape(4, G)[:, 0].tolist()))
    assert err_by_prompt == {0: 0.0, 1: 0.0, 2: 0.0, 3: 1.0}
    assert rewards.timed_out_rows == G
    assert HANG_TIMEOUT_S <= elapsed < 60, elapsed


def test_a_generation_request_past_its_deadline_names_the_rank(ray_local: Any) -> None:
    """Each generate call sleeps 30 s on a role whose call deadline is 2 s: get_batch raises the timeout naming
    role, rank and method after about 2 s (before: it waited on the request for get_timeout_s, an hour)."""
    role = tiny_role(call_timeout_s=2.0)
    with Cluster("slow_gen", Rollout, role, init_args=(0.0, 30.0), start_timeout_s=60.0) as slow:
        opts = GenerateOptions(group_size=G, request_prompts=2)
        started = time.monotonic()
        with (
            GenerateScheduler(generating(slow), Counter(0), opts) as scheduler,
            pytest.raises(WorkerTimeoutError, match=r"slow_gen rank 0: generate did not answer within 2s"),
        ):
            scheduler.get_batch(2, trainer_version=0)
        assert 2.0 <= time.monotonic() - started < 25
