"""roll's pytest plugin: one shared local Ray per test run, the ``gpu`` and ``slow`` markers, tiny role configs.

Load it with ``pytest_plugins = ["roll.core.testing"]`` in the top ``conftest.py``.

- ``ray_local`` (session fixture): starts one local Ray (4 logical CPUs, so several small actors fit on a 2-core
  box; no dashboard) on first use and stops it at the end of the run. Ray starting costs ~8 s, which is why it is
  shared. It always starts a fresh local instance, ignoring ``RAY_ADDRESS``, so tests never touch a real cluster.
- ``@pytest.mark.gpu``: skipped, with the reason, when ``torch.cuda.is_available()`` is false. torch is imported
  only if some collected test carries the marker.
- ``@pytest.mark.vllm_cpu`` / ``@pytest.mark.megatron``: a test of the vLLM-on-CPU lane (``.ci/vllm-cpu``) or of
  the Megatron-on-CPU lane (``.ci/megatron``); skipped, with the reason, when ``vllm`` / ``megatron`` is not
  importable. Checked with ``importlib.util.find_spec``, so neither is imported for it. Each lane runs its marker
  and fails when any of its tests is skipped.
- ``@pytest.mark.slow``: the slow tier (an end-to-end learning or kill-and-resume run). The workspace's pytest
  settings leave it out of a bare ``pytest`` (``-m "not slow"``); ``pytest -m slow`` runs it, and CI runs both.
- :func:`tiny_role`: a :class:`RoleConfig` sized for tests (one worker, 0.25 CPU).
- :func:`assert_identical_runs`: two uninterrupted runs of one config log bitwise the same metrics, timing aside.
- ``kill_and_resume`` (fixture): the exact-resume check of any pipeline. A real ``roll train`` subprocess is
  SIGKILLed (no clean exit) once its first checkpoint is on disk, ``resume=auto`` finishes the run in a second
  subprocess, and every logged metric of every step after the checkpoint must equal, bitwise, the
  uninterrupted run's. :func:`read_metrics` reads a run's ``metrics.jsonl``. Both subprocesses attach to the
  session's Ray (``ray.address=<its GCS>``) instead of starting their own (~8 s each): Ray kills a dead
  driver's actors and frees its placement groups, so the resumed run gets the same resources back.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from roll.core.config.sections import RayConfig, RoleConfig

__all__ = [
    "TEST_NUM_CPUS",
    "assert_identical_runs",
    "kill_and_resume",
    "ray_local",
    "read_metrics",
    "tiny_role",
]

TEST_NUM_CPUS = 4.0


def tiny_role(**overrides: Any) -> RoleConfig:
    """A RoleConfig for tests: 1 worker, 0.25 CPU, no GPU, unless ``overrides`` say otherwise."""
    fields: dict[str, Any] = {"num_workers": 1, "cpus_per_worker": 0.25, "gpus_per_worker": 0.0}
    fields.update(overrides)
    return RoleConfig(**fields)


@pytest.fixture(scope="session")
def ray_local() -> Iterator[Any]:
    """The session's local Ray, as a :class:`~roll.core.cluster.runtime.RayHandle`."""
    from roll.core.cluster.runtime import init_ray, shutdown_ray

    handle = init_ray(RayConfig(address="local", num_cpus=TEST_NUM_CPUS, call_timeout_s=60.0))
    try:
        yield handle
    finally:
        if handle.started_here:
            shutdown_ray()


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too, so a package's tests run with --strict-markers without the root pytest settings.
    config.addinivalue_line("markers", "gpu: needs CUDA; skipped cleanly without it")
    config.addinivalue_line("markers", "slow: an end-to-end learning or kill-and-resume run (the slow tier)")
    for marker, (_module, text) in LANE_MARKERS.items():
        config.addinivalue_line("markers", f"{marker}: {text}")


LANE_MARKERS = {
    "vllm_cpu": ("vllm", "runs vLLM for real on CPU (the .ci/vllm-cpu lane); skipped without vllm"),
    "megatron": (
        "megatron",
        "runs Megatron-Core on CPU over gloo (the .ci/megatron lane); skipped without it",
    ),
}
"""Marker -> (the module a lane installs, the marker's help). A lane's tests skip where its module is absent."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker, (module, _text) in LANE_MARKERS.items():
        _skip_lane_without_module(items, marker, module)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = _cuda_missing_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)


def _skip_lane_without_module(items: list[pytest.Item], marker: str, module: str) -> None:
    lane_items = [item for item in items if item.get_closest_marker(marker) is not None]
    if not lane_items or importlib.util.find_spec(module) is not None:
        return
    lane = marker.replace("_", "-")
    skip = pytest.mark.skip(
        reason=f"{marker} test: {module} is not installed here; run it with `bash .ci/{lane}`"
    )
    for item in lane_items:
        item.add_marker(skip)


def _cuda_missing_reason() -> str | None:
    """None when CUDA is usable, else why the ``gpu`` tests are skipped."""
    try:
        import torch
    except ImportError:
        return "gpu test: torch is not installed"
    if not torch.cuda.is_available():
        return "gpu test: torch.cuda.is_available() is False (no CUDA device or a CPU-only torch)"
    return None


Metrics = dict[int, dict[str, float]]
KillAndResume = Callable[[Path, Sequence[str], Metrics, Path], int]
Run = Callable[[list[str]], object]
TIMING_PREFIXES = ("time/", "throughput/")
"""Metrics that measure the machine, not the run: left out of exact-resume comparisons."""

START_TIMEOUT_S = 300


def read_metrics(out: Path) -> Metrics:
    """``{step: metrics}`` of a run's ``metrics.jsonl``; were a step logged twice, its last line would count (a
    resume or a restart rewinds the file to its checkpoint first, so it is not)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["metrics"] for row in rows}


def _cli(yaml: Path, args: Sequence[str], cwd: Path, log: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)  # its own Ray, started and owned by the subprocess
    out = (cwd / log).open("w")  # a file, not a pipe: nobody drains a pipe while we wait
    cmd = [sys.executable, "-m", "roll.core.cli", "train", str(yaml), *args]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def _tail(path: Path) -> str:
    return path.read_text()[-3000:]


def _kill_after_first_checkpoint(proc: subprocess.Popen[str], out: Path, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not list((out / "checkpoints").glob("step_*")):
        assert proc.poll() is None, f"the run ended before its first checkpoint:\n{_tail(log)}"
        assert time.monotonic() < deadline, f"no checkpoint after {START_TIMEOUT_S} s:\n{_tail(log)}"
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def _check(yaml: Path, args: Sequence[str], expected: Metrics, workdir: Path, *, ray_address: str) -> int:
    from roll.core.checkpoint import CheckpointManager

    out = workdir / "killed"
    run_args = [f"output_dir={out}", f"ray.address={ray_address}", "ray.num_cpus=null", *args]
    _kill_after_first_checkpoint(_cli(yaml, run_args, workdir, "killed.log"), out, workdir / "killed.log")
    latest = CheckpointManager(out / "checkpoints", keep_last=2).latest()
    assert latest is not None
    resumed_at = int(latest.name.split("_")[1])
    last = max(expected)
    assert resumed_at < last, "the checkpoint is the last step: nothing left to resume"
    resumed = _cli(yaml, [*run_args, "resume=auto"], workdir, "resumed.log")
    assert resumed.wait(timeout=START_TIMEOUT_S) == 0, _tail(workdir / "resumed.log")
    assert_same_metrics(read_metrics(out), expected, range(resumed_at + 1, last + 1))
    return resumed_at


def assert_same_metrics(got: Metrics, expected: Metrics, steps: Sequence[int]) -> None:
    """Every metric of every step in ``steps`` (timing aside) is bitwise the expected one."""
    for step in steps:
        for name, value in expected[step].items():
            if not name.startswith(TIMING_PREFIXES):
                assert got[step][name] == value, (step, name, got[step][name], value)


def assert_identical_runs(first: Metrics, second: Metrics) -> None:
    """Two runs of one config logged the same steps, each with the same metric names and, timing aside, bitwise the
    same values. The first difference is reported with its step and name (the place to start bisecting)."""
    assert sorted(first) == sorted(second), f"different steps logged: {sorted(first)} vs {sorted(second)}"
    for step in sorted(first):
        names = {n for n in first[step] if not n.startswith(TIMING_PREFIXES)}
        other = {n for n in second[step] if not n.startswith(TIMING_PREFIXES)}
        assert names == other, (step, sorted(names ^ other))
    differences = [
        (step, name, first[step][name], second[step][name])
        for step in sorted(first)
        for name in sorted(first[step])
        if not name.startswith(TIMING_PREFIXES) and first[step][name] != second[step][name]
    ]
    assert not differences, f"{len(differences)} metrics differ; the first: {differences[:3]}"


def _resume_matches(run: Run, workdir: Path, *, steps: int = 4, at: int = 2) -> Metrics:
    full, resumed = workdir / "full", workdir / "resumed"
    common = [f"max_steps={steps}", f"checkpoint.every_n_steps={at}", f"checkpoint.keep_last={steps}"]
    run([f"output_dir={full}", *common])
    checkpoint = full / "checkpoints" / f"step_{at:06d}"
    assert checkpoint.is_dir(), f"no checkpoint at step {at}"
    run([f"output_dir={resumed}", *common, f"resume={checkpoint}"])
    expected, got = read_metrics(full), read_metrics(resumed)
    assert min(got) == at + 1, f"the resumed run did not start after step {at}: {sorted(got)}"
    assert_same_metrics(got, expected, range(at + 1, steps + 1))
    return expected


@pytest.fixture(scope="session")
def resume_matches() -> Callable[..., Metrics]:
    """``check(run, workdir, steps=4, at=2) -> metrics``: the in-process exact-resume check. ``run(overrides)``
    trains a pipeline in this process (on the shared Ray); an uninterrupted run of ``steps`` steps checkpoints
    every ``at`` steps, a second run in a fresh output dir resumes from its step-``at`` checkpoint, and every
    logged metric of every later step (time and throughput aside) must equal the uninterrupted run's, bitwise."""
    return _resume_matches


@pytest.fixture
def kill_and_resume(ray_local: Any) -> KillAndResume:
    """``check(yaml, args, expected_metrics, workdir) -> resumed_at``: SIGKILL ``roll train yaml *args`` after
    its first checkpoint, resume it, and assert every step after the checkpoint logs ``expected_metrics``
    (time/* and throughput/* aside) bitwise. ``args`` must describe the same run as the one that produced
    ``expected_metrics``."""
    return functools.partial(_check, ray_address=ray_local.address)
