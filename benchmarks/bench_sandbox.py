"""Benchmark: per-call overhead of the code sandbox's isolation layers.

Runs the same trivial program (``pass``) through each launch plan this host allows and through a bare
``python -I -S`` subprocess, and prints the mean wall time per call. The jail's cost over the namespaces-only plan
is the price of hiding the host's files (mount namespace, read-only binds, tmpfs, a fresh ``/proc``).

Usage: ``uv run python benchmarks/bench_sandbox.py [--calls 30]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Callable

from roll.pipelines.rewards.config import SandboxConfig
from roll.pipelines.rewards.sandbox import Sandbox


def _mean_s(call: Callable[[], object], calls: int) -> float:
    call()  # warm-up (and the one-time probe)
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=30)
    calls = parser.parse_args().calls
    jail = Sandbox(SandboxConfig())
    rows: list[tuple[str, float]] = [
        (
            "bare python -I -S",
            _mean_s(lambda: subprocess.run([jail._launcher.python, "-I", "-S", "-c", "pass"]), calls),
        ),
        (
            "sandbox, no namespaces",
            _mean_s(
                lambda: Sandbox(SandboxConfig(network_namespace=False, allow_unisolated=True)).run("pass"),
                calls,
            ),
        ),
        (
            "sandbox, net+pid namespaces",
            _mean_s(
                lambda: Sandbox(SandboxConfig(filesystem_jail=False, allow_unisolated=True)).run("pass"),
                calls,
            ),
        ),
        (f"sandbox, full {jail.isolation}", _mean_s(lambda: jail.run("pass"), calls)),
    ]
    print(f"load average {os.getloadavg()[0]:.2f}")
    for name, seconds in rows:
        print(f"{seconds * 1000:7.1f} ms/call  {name}")


if __name__ == "__main__":
    main()
