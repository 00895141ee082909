"""Logits-transfer throughput: teacher top-k rows to the student ranks that hold the same samples.

Two paths, the ones :mod:`roll.pipelines.distill` uses (see :mod:`roll.workers.logits_transfer`):

- ``object_store``: the teacher's top-k reach the driver as a Batch (as ``teacher.topk_logits`` returns them), are
  aligned to the student batch by sample id (``align_to``), joined onto it, and DP-split to the student ranks
  through Ray's object store.
- ``collective``: each teacher rank sends each student rank exactly its rows, point to point over a gloo group
  (``send_topk`` / ``receive_topk``); nothing passes through the driver.

What is timed is the transfer alone: the "teacher" holds synthetic top-k values (float32) and indices (int64)
``[B, T, K]``, so the numbers do not depend on a model's speed. The student side checks that what arrived equals
what was sent (bit for bit) on the first repetition. MB counts the top-k payload (12 bytes per entry).

Run: ``uv run python benchmarks/bench_logits_transfer.py [--samples 64 --seq 256 --students 2 --reps 5]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster, Dispatch, Worker, WorkerContext, register
from roll.core.cluster.runtime import init_ray, shutdown_ray
from roll.core.config.sections import RayConfig, RoleConfig
from roll.workers.logits_transfer import align_to, receive_topk, send_topk
from roll.workers.model_update import CollectiveGroup, free_port

GROUP = "bench-topk"


def synthetic_topk(n: int, T: int, k: int, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        {
            C.TOPK_VALUES: torch.randn(n, T, k, generator=g),
            C.TOPK_INDICES: torch.randint(0, 151_000, (n, T, k), generator=g),
            C.SAMPLE_ID: torch.arange(n),
        }
    )


class TeacherSide(Worker):
    """Holds the top-k of every sample (a teacher that has already run its forward)."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        torch.set_num_threads(1)
        self.topk: Batch | None = None
        self.group: CollectiveGroup | None = None

    @register(Dispatch.ONE_TO_ALL)
    def prepare(self, n: int, T: int, k: int) -> None:
        self.topk = synthetic_topk(n, T, k, seed=k)

    @register(Dispatch.RANK_ZERO)
    def topk_logits(self) -> Batch:
        assert self.topk is not None
        return self.topk

    @register(Dispatch.RANK_ZERO)
    def endpoint(self) -> tuple[str, int]:
        return self.node_ip, free_port()

    @register(Dispatch.ONE_TO_ALL)
    def join(self, addr: str, port: int, world: int) -> None:
        self.group = CollectiveGroup(addr, port, self.rank, world, "gloo")

    @register(Dispatch.ONE_TO_ALL)
    def send(self, key: str) -> None:
        assert self.group is not None and self.topk is not None
        send_topk(self.group, self.topk, src=self.rank, num_sources=self.world_size, key=key)


class StudentSide(Worker):
    """A student rank: receives its rows' top-k and reports the bytes (and, once, a checksum against the truth)."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        torch.set_num_threads(1)
        self.group: CollectiveGroup | None = None

    @register(Dispatch.ONE_TO_ALL)
    def join(self, addr: str, port: int, world: int, offset: int) -> None:
        self.group = CollectiveGroup(addr, port, offset + self.rank, world, "gloo")

    @register(Dispatch.DP_SPLIT)
    def consume(self, batch: Batch, check: bool, n: int, k: int) -> list[int]:
        """Object-store path: the top-k arrived inside ``batch``."""
        return [_check(batch, n, k) if check else batch.tensors[C.TOPK_VALUES].numel()]

    @register(Dispatch.DP_SPLIT)
    def receive(self, batch: Batch, key: str, sources: int, n: int, k: int, check: bool) -> list[int]:
        """Collective path: receive this rank's rows from every teacher rank."""
        assert self.group is not None
        T = batch.tensors[C.INPUT_IDS].shape[1]
        got = receive_topk(self.group, batch.tensors[C.SAMPLE_ID], num_sources=sources, T=T, k=k, key=key)
        return [_check(got, n, k) if check else got.tensors[C.TOPK_VALUES].numel()]


def _check(got: Batch, n: int, k: int) -> int:
    T = got.tensors[C.TOPK_VALUES].shape[1]
    truth = align_to(synthetic_topk(n, T, k, seed=k), got.tensors[C.SAMPLE_ID])
    if not (
        torch.equal(got.tensors[C.TOPK_VALUES], truth.tensors[C.TOPK_VALUES])
        and torch.equal(got.tensors[C.TOPK_INDICES], truth.tensors[C.TOPK_INDICES])
    ):
        raise AssertionError("transferred top-k differ from the teacher's")
    return int(got.tensors[C.TOPK_VALUES].numel())


def object_store_once(teacher: Cluster, student: Cluster, student_batch: Batch, k: int, check: bool) -> None:
    topk = teacher.topk_logits()
    joined = student_batch.union(align_to(topk, student_batch.tensors[C.SAMPLE_ID]))
    student.consume(joined, check, len(student_batch), k)


def collective_once(teacher: Cluster, student: Cluster, batch: Batch, key: str, k: int, check: bool) -> None:
    sending = teacher.send.submit(key)
    student.receive(batch, key, teacher.world_size, len(batch), k, check)
    sending.result()


def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    role = RoleConfig(num_workers=1, cpus_per_worker=0.25)
    teacher = Cluster("teacher", TeacherSide, role)
    student = Cluster("student", StudentSide, role.model_copy(update={"num_workers": args.students}))
    addr, port = teacher.endpoint()
    world = 1 + args.students
    joins = [teacher.join.submit(addr, port, world), student.join.submit(addr, port, world, 1)]
    for call in joins:
        call.result()
    n, T = args.samples, args.seq
    # the students hold the rows in another order than the teacher
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    student_batch = Batch({C.SAMPLE_ID: order, C.INPUT_IDS: torch.zeros(n, T, dtype=torch.long)})
    rows: list[dict[str, Any]] = []
    for k in args.k:
        teacher.prepare(n, T, k)
        mb = n * T * k * 12 / 1e6
        paths: dict[str, Callable[[int, int], None]] = {
            "object_store": lambda rep, k: object_store_once(teacher, student, student_batch, k, rep == 0),
            "collective": lambda rep, k: collective_once(
                teacher, student, student_batch, f"k{k}r{rep}", k, rep == 0
            ),
        }
        for name, once in paths.items():
            once(-1, k)  # warm-up (first group use, first puts) outside the timing
            start = time.perf_counter()
            for rep in range(args.reps):
                once(rep, k)
            seconds = (time.perf_counter() - start) / args.reps
            rows.append(
                {"path": name, "k": k, "MB": mb, "s": seconds, "MB/s": mb / seconds, "samples/s": n / seconds}
            )
    teacher.shutdown()
    student.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--students", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--k", type=int, nargs="+", default=[16, 64, 256])
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_flush_denormal(True)
    init_ray(RayConfig(address="local", num_cpus=2))
    try:
        rows = bench(args)
    finally:
        shutdown_ray()
    print(
        f"\nlogits transfer: {args.samples} samples x {args.seq} tokens, 1 teacher rank -> {args.students} student ranks"
    )
    print(f"{'path':<13}{'k':>5}{'MB/step':>10}{'s/step':>9}{'MB/s':>9}{'samples/s':>11}")
    for r in rows:
        print(
            f"{r['path']:<13}{r['k']:>5}{r['MB']:>10.1f}{r['s']:>9.3f}{r['MB/s']:>9.1f}{r['samples/s']:>11.1f}"
        )


if __name__ == "__main__":
    main()
