"""Typed cluster handles: the type checker follows a driver's calls into the worker methods they run.

A handle (``on_cluster``) types each cluster method from the worker's own: its parameters, and the result its
dispatch mode collects. These tests run mypy, the repo's checker, on a driver that gets calls wrong, and check the
generated handle modules against the worker classes they describe.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import pytest

from roll.core.cluster import Cluster, Dispatch, Worker, register
from roll.core.cluster.cluster import on_cluster
from roll.core.cluster.dispatch import overridden_methods, registered_functions, registered_methods

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
from __future__ import annotations

from typing import cast

from roll.core.batch import Batch
from roll.core.cluster import Cluster, Dispatch, Worker, register
from roll.core.cluster.cluster import on_cluster
from roll.core.scheduler import RankRequest, RewardScheduler


class Scorer(Worker):
    @register(Dispatch.DP_SPLIT)
    def score(self, batch: Batch, scale: float = 1.0) -> Batch:
        return batch

    @register(Dispatch.MP_SPLIT)
    def train_step(self, batch: Batch, lr: float) -> dict[str, float]:
        return {}

    @register(Dispatch.RANK_ZERO)
    def endpoint(self) -> tuple[str, int]:
        return ("", 0)

    @register(Dispatch.ONE_TO_ALL)
    def version(self) -> int:
        return 0


class ScorerCluster(Cluster):
    score = on_cluster(Scorer.score)
    train_step = on_cluster(Scorer.train_step)
    endpoint = on_cluster(Scorer.endpoint)
    version = on_cluster(Scorer.version)


def drive(cluster: Cluster, batch: Batch) -> None:
    scorers = cast(ScorerCluster, cluster)
    reveal_type(scorers.score(batch, scale=2.0))
    reveal_type(scorers.train_step(batch, 0.1))
    reveal_type(scorers.endpoint())
    reveal_type(scorers.version.submit().result())
    scorers.score(batch, scale="2")  # wrong type
    scorers.train_step(batch)  # missing argument
    scorers.scroe(batch)  # no such method
    cluster.score(batch)  # an untyped cluster has no methods to the type checker
    reveal_type(RankRequest.bind(scorers.score, 2.0))
    RankRequest.bind(scorers.score, "2")  # a scheduled call's bound argument of the wrong type
    RewardScheduler({"d": RankRequest.bind(scorers.score)}, {}, columns=("x",))  # rows it will not get
"""


def test_mypy_checks_the_arguments_and_results_of_cluster_calls(tmp_path: Path) -> None:
    """Results follow the dispatch mode (DP/MP of a Batch: the Batch; MP of a dict: one per DP rank; RANK_ZERO:
    rank 0's; ONE_TO_ALL: one per rank), and each mistake is reported at its line. A scheduled call
    (``RankRequest.bind``) is checked where the driver binds it: its bound arguments against the worker method's
    parameters, and its rows against what the scheduler sends (with ``columns``, a RewardScheduler sends plain
    lists, which ``Scorer.score`` does not take)."""
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(DRIVER))
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--follow-imports=silent",
         "--config-file", str(ROOT / "pyproject.toml"), str(driver)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    lines = run.stdout.splitlines()
    revealed = [line.split("Revealed type is ")[1] for line in lines if "Revealed type is" in line]
    assert revealed == [
        '"roll.core.batch.Batch"',
        '"list[dict[str, float]]"',
        '"tuple[str, int]"',
        '"list[int]"',
        '"roll.core.scheduler.rank_calls.RankRequest[roll.core.batch.Batch]"',
    ], run.stdout
    errors = [line for line in lines if ": error:" in line]
    expected = [
        ('scale="2"', 'has incompatible type "str"; expected "float"'),
        ("train_step(batch)", 'Missing positional argument "lr"'),
        ("scroe(batch)", '"ScorerCluster" has no attribute "scroe"'),
        ("cluster.score(batch)", '"Cluster" has no attribute "score"'),
        (
            'bind(scorers.score, "2")',
            'Argument 2 to "bind" of "RankRequest" has incompatible type "str"; expected "float"',
        ),
        ('RewardScheduler({"d"', 'expected "RowsMethod[dict[str, list[Any]], []]"'),
    ]
    source = driver.read_text().splitlines()
    assert len(errors) == len(expected), run.stdout
    for error, (code, message) in zip(errors, expected, strict=True):
        line = int(error.split(":")[1])
        assert code in source[line - 1] and message in error, error


def test_the_generated_handles_are_current_and_cover_every_registered_method() -> None:
    """``scripts/gen_cluster_handles.py --check`` passes: every role's handle lists exactly its registered methods,
    each declared from the function that runs, the role's or its part's (so a renamed or re-dispatched worker method changes the handle)."""
    run = subprocess.run(
        [sys.executable, "scripts/gen_cluster_handles.py", "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    from roll.workers.roles.actor import ActorTrainWorker
    from roll.workers.roles.clusters import ActorTrainCluster

    declared = {
        n: v for k in ActorTrainCluster.__mro__ if issubclass(k, Cluster) and k is not Cluster
        for n, v in vars(k).items() if not n.startswith("_")
    }  # fmt: skip
    functions = registered_functions(ActorTrainWorker)
    assert set(declared) == set(functions) - set(registered_methods(Worker))
    assert all(declared[n] is functions[n] for n in declared)


def test_the_hybrid_handle_is_its_parts_handles_plus_its_own_methods() -> None:
    """HybridActorCluster subclasses PolicyTrainerCalls and WeightSenderCalls and declares only its own methods;
    its overrides of the trainer's (setup, offload, reload: the part's signatures) are typed by the part's handle,
    every other member is the function that runs."""
    from roll.workers.roles.actor import PolicyTrainer
    from roll.workers.roles.clusters import HybridActorCluster, PolicyTrainerCalls, WeightSenderCalls
    from roll.workers.roles.hybrid import HybridActorWorker

    assert HybridActorCluster.__bases__ == (PolicyTrainerCalls, WeightSenderCalls)
    own = {n for n in vars(HybridActorCluster) if not n.startswith("_")}
    assert own == {
        "generate",
        "policy_version",
        "served_checksum",
        "sync_weights",
        "offload_side",
        "reload_side",
    }
    assert overridden_methods(HybridActorWorker) == {
        "setup": "trainer",
        "offload": "trainer",
        "reload": "trainer",
    }
    functions = registered_functions(HybridActorWorker)
    for name in ("setup", "offload", "reload"):
        assert getattr(HybridActorCluster, name) is getattr(PolicyTrainer, name)
        assert functions[name] is getattr(HybridActorWorker, name)  # what the cluster runs: the override
    assert all(getattr(HybridActorCluster, n) is functions[n] for n in own)


class _Part:
    @register(Dispatch.ONE_TO_ALL)
    def same(self, x: int, y: str = "a") -> list[int]:
        return [x]

    @register(Dispatch.ONE_TO_ALL)
    def wider(self, x: int) -> int:
        return x

    @register(Dispatch.ONE_TO_ALL)
    def moved(self, xs: list[int]) -> list[int]:
        return xs


class _Overrider(Worker):
    parts: ClassVar[Mapping[str, type]] = {"p": _Part}

    @register(Dispatch.ONE_TO_ALL, overrides=True)
    def same(self, x: int, y: str = "a") -> list[int]:
        return [x, x]

    @register(Dispatch.ONE_TO_ALL, overrides=True)
    def wider(self, x: int, scale: int = 1) -> int:
        return x * scale

    @register(Dispatch.DP_SPLIT, overrides=True)
    def moved(self, xs: list[int]) -> list[int]:
        return xs


def test_the_generator_declares_an_override_only_where_its_type_differs_from_the_parts() -> None:
    """An override with the part's signature and mode needs no member of its own (the part's handle types it); an
    extra parameter or another dispatch mode does."""
    spec = importlib.util.spec_from_file_location(
        "gen_cluster_handles", ROOT / "scripts/gen_cluster_handles.py"
    )
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen._same_as_the_parts(_Overrider) == {"same"}
    assert gen._same_as_the_parts(Worker) == set()


def test_on_cluster_refuses_a_method_that_is_not_registered() -> None:
    class Plain(Worker):
        @register(Dispatch.ONE_TO_ALL)
        def marked(self) -> int:
            return 1

        def unmarked(self) -> int:
            return 2

    assert on_cluster(Plain.marked) is Plain.marked
    with pytest.raises(TypeError, match="not a method marked with @register"):
        on_cluster(Plain.unmarked)  # type: ignore[call-overload]
