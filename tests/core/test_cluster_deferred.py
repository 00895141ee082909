"""Clusters of workers named by a WorkerRef: the driver never imports the worker's module, the actors do.

The memory goal wants a driver without torch while every model role's module imports it: the driver names the
class (``WorkerRef``), the actor imports it and forwards every call, and ``Worker.apply`` runs torch work in an
actor's process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from roll.core.batch import Batch
from roll.core.cluster import Cluster, Dispatch, Worker, WorkerContext, WorkerRef, register
from roll.core.errors import WorkerError
from roll.core.scheduler.rank_calls import submit_to_rank
from roll.core.testing import tiny_role

ECHO = WorkerRef("tests.core.test_cluster", "Echo")


class TorchEcho(Worker):
    """A worker whose module imports torch at the top, as every model role's does."""

    def __init__(self, ctx: WorkerContext, scale: float = 1.0) -> None:
        super().__init__(ctx)
        self.scale = scale

    @register(Dispatch.DP_SPLIT)
    def scaled(self, batch: Batch) -> Batch:
        assert isinstance(batch.tensors["x_B"], torch.Tensor)  # numpy from a torch-free driver, torch here
        batch.tensors["y_B"] = batch.tensors["x_B"] * self.scale + 100 * self.rank
        return batch


def torch_sum(batch: Batch) -> tuple[float, bool]:
    """Runs in an actor through ``apply``: torch is there, and the batch's columns are torch tensors."""
    return float(batch.to_torch().tensors["x_B"].sum()), "torch" in sys.modules


@pytest.fixture(scope="module")
def echo(ray_local: Any) -> Iterator[Cluster]:
    with Cluster(
        "deferred", ECHO, tiny_role(num_workers=2), init_kwargs={"offset": 10}, wait=False
    ) as cluster:
        yield cluster


def test_a_deferred_cluster_forwards_every_dispatch_mode(echo: Cluster) -> None:
    assert echo.add(1) == [11, 12]  # ONE_TO_ALL, learnt from rank 0 on first use
    assert echo.double([1, 2, 3]) == [2, 4, 106]  # DP_SPLIT padded to 4 rows and unpadded
    assert echo.whoami() == "deferred:0/2"  # RANK_ZERO
    assert {"add", "double", "whoami", "apply", "ping"} <= set(echo.methods)
    assert echo.shifted([1, 2, 3]) == [11, 12, 1013]  # a method of Echo's part, through the same forwarder
    assert {"shifted", "part_whoami"} <= set(echo.methods)
    assert submit_to_rank(echo.methods["add"], 1, 5).pending.result() == 16


def test_a_deferred_cluster_names_role_rank_and_method_in_errors(echo: Cluster) -> None:
    with pytest.raises(WorkerError, match=r"deferred rank 1: boom raised ValueError") as info:
        echo.boom("bad input")
    assert "bad input" in str(info.value)
    with pytest.raises(AttributeError, match=r"no registered method 'nope'.*whoami"):
        echo.nope  # noqa: B018


def process_title() -> str:
    import psutil

    return " ".join(psutil.Process().cmdline())


def test_the_actor_process_is_named_after_the_worker(echo: Cluster) -> None:
    """Ray titles an actor's process (and prefixes its log lines) with the class name: the worker's own."""
    assert echo.apply(process_title).startswith("ray::Echo"), echo.apply(process_title)


def test_apply_runs_in_rank_zero_process(echo: Cluster) -> None:
    assert echo.apply(os.getpid) == echo.get_info()[0].pid != os.getpid()
    numpy_batch = Batch({"x_B": torch.arange(4.0)}).to_numpy()
    assert echo.apply(torch_sum, numpy_batch) == (6.0, True)


def test_a_ref_to_a_non_worker_fails_at_start_naming_it(ray_local: Any) -> None:
    with pytest.raises(
        WorkerError,
        match=r"(?s)wrong rank 0: __init__.*tests.core.test_cluster:Rows is not a Worker subclass",
    ):
        Cluster("wrong", WorkerRef("tests.core.test_cluster", "Rows"), tiny_role()).ping()


@pytest.mark.slow
def test_a_driver_runs_torch_workers_without_importing_torch(tmp_path: Any) -> None:
    """Torch-free driver, torch actors: the numpy batch is torch in the actors and numpy again on its way back.
    The driver prints whether torch came in."""
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        from roll.core.batch import Batch
        from roll.core.cluster import Cluster, WorkerRef, init_ray
        from roll.core.config.sections import RayConfig
        from roll.core.testing import tiny_role

        init_ray(RayConfig(address="local", num_cpus=2, call_timeout_s=120.0))
        ref = WorkerRef("tests.core.test_cluster_deferred", "TorchEcho")
        cluster = Cluster("torch_role", ref, tiny_role(num_workers=2), init_kwargs={"scale": 2.0})
        out = cluster.scaled(Batch({"x_B": np.arange(5, dtype=np.float32)}))
        print(type(out.tensors["y_B"]).__name__, out.tensors["y_B"].tolist(), "torch" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False,
        cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    # 5 rows over 2 ranks: 3 + 3 with one pad row; rank 1's rows get +100, the pad row is dropped
    assert out.stdout.split("\n")[-2] == "ndarray [0.0, 2.0, 4.0, 106.0, 108.0] False", (
        out.stdout + out.stderr[-3000:]
    )
