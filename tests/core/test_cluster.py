"""Cluster, dispatch and Worker against real Ray actors on the shared local Ray.

Worker classes here import no torch (an actor that imports torch costs ~15 s on a 2-core box), except the one
torch.distributed test. Actors are few: one shared 2-rank cluster for the dispatch tests, and throwaway 2-rank
clusters for the tests that hang or kill an actor.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import ray

from roll.core.cluster import Cluster, Dispatch, Worker, WorkerContext, register
from roll.core.cluster.dispatch import overridden_methods, part_methods, registered_functions
from roll.core.errors import WorkerError, WorkerTimeoutError
from roll.core.testing import tiny_role


@dataclass
class Rows:
    """A minimal Shardable, standing in for roll.core.batch.Batch: a list of ints with the DP_SPLIT methods."""

    items: list[int]

    def __len__(self) -> int:
        return len(self.items)

    def chunk(self, n: int) -> list[Rows]:
        size = len(self.items) // n
        return [Rows(self.items[i * size : (i + 1) * size]) for i in range(n)]

    def pad_to_multiple(self, k: int) -> tuple[Rows, int]:
        pad = -len(self.items) % k
        return Rows(self.items + [self.items[-1]] * pad), pad

    def unpad(self, n: int) -> Rows:
        return Rows(self.items[: len(self.items) - n])

    @classmethod
    def concat(cls, parts: list[Rows]) -> Rows:
        return Rows([x for p in parts for x in p.items])


class Shifter:
    """A part (see roll.core.cluster.dispatch): registered methods that Echo holds instead of defining them."""

    def __init__(self, worker: Worker, shift: int) -> None:
        self.worker, self.shift = worker, shift

    @register(Dispatch.DP_SPLIT)
    def shifted(self, rows: list[int]) -> list[int]:
        return [r + self.shift + 1000 * self.worker.rank for r in rows]

    @register(Dispatch.RANK_ZERO, timeout_s=2.5)
    def part_whoami(self) -> str:
        return f"{self.worker.role}:{self.worker.rank}"

    @register(Dispatch.ONE_TO_ALL)
    def part_boom(self, msg: str) -> int:
        if self.worker.rank == 1:
            raise ValueError(msg)
        return 0

    @register(Dispatch.ONE_TO_ALL)
    def described(self, prefix: str) -> str:
        return f"{prefix}shift {self.shift}"


class Echo(Worker):
    parts: ClassVar[Mapping[str, type]] = {"shifter": Shifter}

    def __init__(self, ctx: WorkerContext, offset: int = 0) -> None:
        super().__init__(ctx)
        self.offset = offset
        self.shifter = Shifter(self, offset)

    @register(Dispatch.ONE_TO_ALL)
    def add(self, x: int) -> int:
        return x + self.rank + self.offset

    @register(Dispatch.DP_SPLIT)
    def double(self, rows: list[int], factor: int = 2) -> list[int]:
        return [factor * r + 100 * self.rank for r in rows]

    @register(Dispatch.DP_SPLIT)
    def double_rows(self, rows: Rows) -> Rows:
        return Rows([2 * r for r in rows.items])

    @register(Dispatch.DP_SPLIT)
    def shard_len(self, rows: list[int]) -> int:
        return len(rows)

    @register(Dispatch.RANK_ZERO)
    def whoami(self) -> str:
        return f"{self.role}:{self.rank}/{self.world_size}"

    @register(Dispatch.ONE_TO_ALL)
    def boom(self, msg: str) -> int:
        if self.rank == 1:
            raise ValueError(msg)
        return 0

    @register(Dispatch.ONE_TO_ALL, timeout_s=1.5)
    def hang(self) -> int:
        if self.rank == 1:
            time.sleep(60)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    @register(Dispatch.ONE_TO_ALL)
    def triton_blocked(self) -> bool:
        """Whether ``import triton`` fails here the way the GPU-free setup hook makes it (``None`` in sys.modules)."""
        try:
            import triton  # noqa: F401
        except ImportError:
            return "triton" in sys.modules and sys.modules["triton"] is None
        return False

    @register(Dispatch.ONE_TO_ALL, overrides=True)
    def described(self, prefix: str) -> str:
        """Replaces Shifter.described (same signature and mode) and calls it: the cluster runs this one."""
        return f"echo rank {self.rank} over {self.shifter.described(prefix)}"

    def not_registered(self) -> None:
        pass


class Gloo(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())

    @register(Dispatch.DP_SPLIT)
    def square(self, batch: Any) -> Any:
        batch["y_B"] = batch["x_B"] ** 2 + 1000 * self.rank
        return batch


@pytest.fixture(scope="module")
def echo(ray_local: Any) -> Iterator[Cluster]:
    with Cluster("actor_train", Echo, tiny_role(num_workers=2), init_kwargs={"offset": 10}) as cluster:
        yield cluster


def test_one_to_all_returns_every_rank(echo: Cluster) -> None:
    assert echo.add(5) == [15, 16]
    assert echo.ping() == [0, 1]


def test_dp_split_pads_and_unpads_a_list(echo: Cluster) -> None:
    # 5 rows over 2 ranks -> padded to 6 (last row repeated), 3 per rank; rank 1 adds 100 to show who did what.
    assert echo.double([1, 2, 3, 4, 5], factor=3) == [3, 6, 9, 112, 115]
    assert echo.shard_len([1, 2, 3, 4, 5]) == [3, 3]  # non-list results come back per rank


def test_dp_split_uses_the_batch_protocol(echo: Cluster) -> None:
    assert echo.double_rows(Rows([1, 2, 3])) == Rows([2, 4, 6])


def test_rank_zero_runs_on_rank_zero_only(echo: Cluster) -> None:
    assert echo.whoami() == "actor_train:0/2"


def test_submit_result_and_await(echo: Cluster) -> None:
    pending = echo.add.submit(1)
    assert pending.result(timeout=30) == [11, 12]
    assert pending.done()

    async def both() -> list[Any]:
        return list(await asyncio.gather(echo.add.submit(2), echo.whoami.submit()))

    assert asyncio.run(both()) == [[12, 13], "actor_train:0/2"]


def test_workers_of_a_ray_roll_started_wait_passively(echo: Cluster) -> None:
    """OpenMP threads of idle workers must not spin on the cores the busy one needs (see cluster.runtime)."""
    expected = os.environ[
        "OMP_WAIT_POLICY"
    ]  # set by init_ray when it started Ray, unless the user had set it
    assert echo.env("OMP_WAIT_POLICY") == [expected, expected]


def test_workers_of_a_gpu_free_ray_roll_started_cannot_import_triton(ray_local: Any) -> None:
    """A Ray without GPUs runs its workers without Triton (80 MB each, see cluster.runtime), also where a role sets
    environment variables of its own (Ray merges them with the hook's); with GPUs, Triton stays importable."""
    gpu_free = ray.cluster_resources().get("GPU", 0) == 0
    env = {"env_vars": {"ROLL_TEST_VAR": "set"}}
    with Cluster("actor_infer", Echo, tiny_role(num_workers=1), runtime_env=env) as cluster:
        assert cluster.env("ROLL_TEST_VAR") == ["set"]
        assert cluster.triton_blocked() == [gpu_free]


def _processes_of(session_dir: str) -> list[str]:
    """The command lines of this machine's processes that name Ray session ``session_dir``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended while we looked
            continue
        if session_dir in args:
            found.append(args)
    return found


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads process command lines from /proc")
def test_a_ray_roll_started_has_no_autoscaler_monitor(ray_local: Any) -> None:
    """One local node never scales: the start skips the autoscaler's monitor process (see cluster.runtime), and
    keeps the log monitor that brings the actors' output to the driver."""
    import ray

    assert ray_local.started_here  # address="local": the session's own Ray

    session_dir = ray._private.worker.global_worker.node.get_session_dir_path()
    processes = _processes_of(session_dir)
    assert any("log_monitor.py" in p for p in processes), processes
    assert not any("autoscaler/_private/monitor.py" in p for p in processes), processes


def test_worker_info_and_rendezvous(echo: Cluster) -> None:
    infos = echo.get_info()
    assert [i.rank for i in infos] == [0, 1]
    assert infos[0].node_id == ray.get_runtime_context().get_node_id()
    assert {i.master_port for i in infos} == {infos[0].master_port} and infos[0].master_port
    assert [i.local_rank for i in infos] == [0, 1]
    assert infos[0].pid != infos[1].pid


def test_unregistered_names_are_rejected(echo: Cluster) -> None:
    with pytest.raises(AttributeError, match=r"no registered method 'not_registered'.*registered: add"):
        echo.not_registered  # noqa: B018
    assert echo.method(Echo.add) is echo.add


def test_exception_becomes_worker_error(echo: Cluster) -> None:
    with pytest.raises(WorkerError) as info:
        echo.boom("bad input 42")
    text = str(info.value)
    assert text.startswith("actor_train rank 1: boom raised ValueError: bad input 42")
    assert "in boom" in text and "RayTaskError" not in text
    assert (info.value.role, info.value.rank, info.value.method) == ("actor_train", 1, "boom")  # type: ignore[attr-defined]
    assert echo.add(0) == [10, 11]  # the actors survive a raising method


def test_a_parts_methods_are_cluster_methods(echo: Cluster) -> None:
    """Echo holds a Shifter (shift = offset 10): its methods dispatch, time out and fail like Echo's own."""
    assert echo.shifted([1, 2, 3]) == [11, 12, 1013]  # DP_SPLIT: [1, 2] | [3, 3 (pad)], the pad row dropped
    assert echo.part_whoami() == "actor_train:0"  # RANK_ZERO
    assert echo.method(Shifter.shifted) is echo.shifted
    assert (echo.part_whoami.timeout_s, echo.part_whoami.spec.mode) == (2.5, Dispatch.RANK_ZERO)
    assert echo.shifted.timeout_s == echo.add.timeout_s  # the role's default, as for Echo's own
    with pytest.raises(WorkerError) as info:
        echo.part_boom("bad part 7")
    assert str(info.value).startswith("actor_train rank 1: part_boom raised ValueError: bad part 7")
    assert (info.value.role, info.value.rank, info.value.method) == ("actor_train", 1, "part_boom")  # type: ignore[attr-defined]


def test_a_role_overrides_a_parts_method_only_when_it_says_so(echo: Cluster) -> None:
    """Echo's ``described`` (``overrides=True``) replaces its Shifter's: the cluster (through the actors) and
    roll_call run Echo's, which calls the part's; unmarked it would be the one-owner TypeError."""
    assert echo.described("> ") == ["echo rank 0 over > shift 10", "echo rank 1 over > shift 10"]
    assert registered_functions(Echo)["described"] is Echo.described
    assert overridden_methods(Echo) == {"described": "shifter"}
    assert "described" not in part_methods(Echo) and part_methods(Echo)["shifted"] == "shifter"
    assert (
        Echo(WorkerContext("local", 0, 1), offset=3).roll_call("described", "") == "echo rank 0 over shift 3"
    )


def test_an_unmarked_clash_or_a_marker_overriding_nothing_fails_where_the_class_is_defined() -> None:
    with pytest.raises(TypeError, match=r"Quiet: method 'described' is registered by the class itself and by "
                       r"part 's' \(Shifter\).*overrides=True"):  # fmt: skip

        class Quiet(Worker):
            parts: ClassVar[Mapping[str, type]] = {"s": Shifter}

            @register(Dispatch.ONE_TO_ALL)
            def described(self, prefix: str) -> str:
                return prefix

    with pytest.raises(TypeError, match=r"Unmarked.described is not registered, but part 's' \(Shifter\) "
                       r"registers 'described': the cluster would call the part's and never it"):  # fmt: skip

        class Unmarked(Worker):
            parts: ClassVar[Mapping[str, type]] = {"s": Shifter}

            def described(self, prefix: str) -> str:
                return prefix

    with pytest.raises(TypeError, match=r"Idle: added, doubled marked overrides=True but no part registers "
                       r"those names \(parts: \['s'\]\)"):  # fmt: skip

        class Idle(Worker):
            parts: ClassVar[Mapping[str, type]] = {"s": Shifter}

            @register(Dispatch.ONE_TO_ALL, overrides=True)
            def added(self) -> None: ...

            @register(Dispatch.ONE_TO_ALL, overrides=True)
            def doubled(self) -> None: ...

    with pytest.raises(
        TypeError, match=r"Partless: ping marked overrides=True but no part registers that name"
    ):

        class Partless(Worker):
            @register(Dispatch.ONE_TO_ALL, overrides=True)
            def ping(self) -> int:  # Worker's own: an override is of a part's method only
                return 0

    class Overriding:
        @register(Dispatch.ONE_TO_ALL, overrides=True)
        def described(self, prefix: str) -> str:
            return prefix

    with pytest.raises(
        TypeError, match=r"Overriding.described is marked overrides=True, but Overriding is a part"
    ):

        class HoldsOverriding(Worker):
            parts: ClassVar[Mapping[str, type]] = {"o": Overriding}

    with pytest.raises(TypeError, match=r"Both: method 'described' overrides part 'a' \(Shifter\)'s and is "
                       r"registered by part 'b' \(Describer\) too"):  # fmt: skip

        class Describer:
            @register(Dispatch.ONE_TO_ALL)
            def described(self, prefix: str) -> str:
                return prefix

        class Both(Worker):
            parts: ClassVar[Mapping[str, type]] = {"a": Shifter, "b": Describer}

            @register(Dispatch.ONE_TO_ALL, overrides=True)
            def described(self, prefix: str) -> str:
                return prefix

    with pytest.raises(TypeError, match=r"register\(overrides=\.\.\.\) takes True or False, got 'yes'"):
        register(Dispatch.ONE_TO_ALL, overrides="yes")  # type: ignore[call-overload]


class OtherShifter:
    @register(Dispatch.DP_SPLIT)
    def shifted(self, rows: list[int]) -> list[int]:
        return rows


def test_a_name_held_twice_fails_where_the_class_is_defined() -> None:
    with pytest.raises(TypeError, match=r"Twice: method 'shifted' is registered by part 'a' \(Shifter\) and by part "
                       r"'b' \(OtherShifter\); a cluster method needs one owner"):  # fmt: skip

        class Twice(Worker):
            parts: ClassVar[Mapping[str, type]] = {"a": Shifter, "b": OtherShifter}

    with pytest.raises(
        TypeError, match=r"Own: method 'shifted' is registered by the class itself and by part 's'"
    ):

        class Own(Worker):
            parts: ClassVar[Mapping[str, type]] = {"s": Shifter}

            @register(Dispatch.ONE_TO_ALL)
            def shifted(self) -> None: ...

    with pytest.raises(
        TypeError, match=r"Nested.parts\['e'\]: Echo declares parts of its own; parts do not nest"
    ):

        class Nested(Worker):
            parts: ClassVar[Mapping[str, type]] = {"e": Echo}

    with pytest.raises(TypeError, match=r"Loose.parts must map attribute names to the classes"):

        class Loose(Worker):
            parts: ClassVar[Mapping[str, type]] = {"s": Shifter(None, 0)}  # type: ignore[dict-item,arg-type]


def test_roll_call_finds_the_part_and_names_one_never_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")  # Worker.__init__ exports RANK and WORLD_SIZE: restored after the test
    monkeypatch.setenv("WORLD_SIZE", "1")

    class Forgetful(Worker):
        parts: ClassVar[Mapping[str, type]] = {"shifter": Shifter}

    echo = Echo(WorkerContext("local", 0, 1), offset=5)
    assert (echo.roll_call("shifted", [1, 2]), echo.roll_call("add", 1)) == ([6, 7], 6)
    with pytest.raises(TypeError, match=r"local rank 0: Forgetful declares part 'shifter' \(Shifter\) but "
                       r"self.shifter is None; set self.shifter to a Shifter in __init__"):  # fmt: skip
        Forgetful(WorkerContext("local", 0, 1)).roll_call("shifted", [1])


def test_hung_method_hits_its_timeout(ray_local: Any) -> None:
    with Cluster("hanger", Echo, tiny_role(num_workers=2)) as cluster:
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError, match=r"hanger rank 1: hang did not answer within 1.5s"):
            cluster.hang()
        elapsed = time.monotonic() - start
        assert 1.4 < elapsed < 1.5 + 5


def _wait_until_dead(actor: Any, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            ray.get(actor.add.remote(0), timeout=5)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.2)
    raise AssertionError(f"the killed actor still answered after {deadline_s} s")


def test_killed_actor_is_reported_with_role_and_rank(ray_local: Any) -> None:
    with Cluster("victim", Echo, tiny_role(num_workers=2, call_timeout_s=20.0)) as cluster:
        ray.kill(cluster.actors[1], no_restart=True)
        # ray.kill only sends the kill: a call right after it may still run
        _wait_until_dead(cluster.actors[1])
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            cluster.add(1)
        elapsed = time.monotonic() - start
        assert elapsed < 20.0 and not isinstance(info.value, WorkerTimeoutError), (elapsed, str(info.value))
        assert str(info.value).startswith("victim rank 1: add failed because the actor is dead"), str(
            info.value
        )


class Broken(Worker):
    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        raise FileNotFoundError("no model at /nope")


def test_init_failure_names_init(ray_local: Any) -> None:
    with pytest.raises(WorkerError, match=r"(?s)broken rank 0: __init__ failed.*no model at /nope"):
        Cluster("broken", Broken, tiny_role(), start_timeout_s=30)


class Slow(Worker):
    """An ``__init__`` that sleeps, as one that imports torch would take its time (sleeping needs no core)."""

    def __init__(self, ctx: WorkerContext, delay_s: float) -> None:
        super().__init__(ctx)
        self.began = time.time()
        time.sleep(delay_s)
        self.ended = time.time()

    @register(Dispatch.ONE_TO_ALL)
    def span(self) -> tuple[float, float]:
        return self.began, self.ended


def test_clusters_launched_without_waiting_start_in_parallel(ray_local: Any) -> None:
    """Two 1-rank clusters whose ``__init__`` sleeps 2 s, built with ``wait=False`` and then used: building
    returns before any ``__init__`` ends, and the two ``__init__`` overlap in time (one after the other, the
    second would begin after the first ended). Timestamps from the workers, so a loaded box cannot flake it."""
    start = time.time()
    clusters = [Cluster(f"slow{i}", Slow, tiny_role(), init_args=(2.0,), wait=False) for i in range(2)]
    launched = time.time()
    try:
        spans = [c.span()[0] for c in clusters]
    finally:
        for c in clusters:
            c.shutdown()
    assert launched - start < min(end for _, end in spans) - start, "building waited for an __init__"
    assert max(began for began, _ in spans) < min(end for _, end in spans), f"one after the other: {spans}"


def test_a_lazy_cluster_raises_the_init_failure_on_first_use(ray_local: Any) -> None:
    broken = Cluster("broken_lazy", Broken, tiny_role(), start_timeout_s=30, wait=False)
    with pytest.raises(WorkerError, match=r"(?s)broken_lazy rank 0: __init__ failed.*no model at /nope"):
        broken.ready()
    assert broken.actors == []  # shut down


def test_bad_init_arguments_fail_at_once(ray_local: Any) -> None:
    with pytest.raises(TypeError, match="no_such_arg"):
        Cluster("typo", Echo, tiny_role(), init_kwargs={"no_such_arg": 1})


@pytest.mark.slow
def test_gloo_all_reduce_across_two_workers(ray_local: Any) -> None:
    with Cluster("dist", Gloo, tiny_role(num_workers=2)) as cluster:
        assert cluster.init_process_group() == ["gloo", "gloo"]
        assert cluster.all_reduce_rank() == [3.0, 3.0]
        cluster.destroy_process_group()
        # The real Batch through DP_SPLIT (torch is already imported in these actors): 5 rows -> 3 + 3 with one
        # pad row, rank 1 marks its rows with +1000, the pad row is gone after the gather.
        import torch

        from roll.core.batch import Batch

        out = cluster.square(Batch({"x_B": torch.arange(5.0)}))
        assert len(out) == 5
        torch.testing.assert_close(out["y_B"], torch.tensor([0.0, 1.0, 4.0, 1009.0, 1016.0]))


_ATTACH_SCRIPT = """
import json, time
from roll.core.cluster import init_ray
from roll.core.config.sections import RayConfig
from roll.core.errors import ResourceError
for address in ("127.0.0.1:9", "no-such-ray-head.invalid:6379"):
    start = time.monotonic()
    try:
        init_ray(RayConfig(address=address))  # the default init_timeout_s (60 s)
    except ResourceError as exc:
        print(json.dumps({"error": str(exc), "elapsed": time.monotonic() - start}))
"""


def test_unreachable_address_fails_fast_with_a_fix() -> None:
    """A closed port is retried for 5 s at most (not the 60 s init timeout); an unknown host fails at once."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "-c", _ATTACH_SCRIPT], capture_output=True, text=True, env=env, timeout=60
    )
    refused, unknown = (json.loads(line) for line in out.stdout.strip().splitlines()[-2:])
    assert "could not attach to Ray at '127.0.0.1:9' (from ray.address)" in refused["error"]
    assert "nothing answered within 5s" in refused["error"] and "ray start --head" in refused["error"]
    assert refused["elapsed"] < 30  # the init timeout is 60 s
    assert (
        "'no-such-ray-head.invalid:6379' (from ray.address): the host name does not resolve"
        in unknown["error"]
    )
    assert unknown["elapsed"] < 4.5 and "ray start --head" in unknown["error"]
