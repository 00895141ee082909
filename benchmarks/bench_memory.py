"""Peak memory per process and start-up time of `roll train examples/quickstart.yaml` (or any config).

Runs `roll train` as a subprocess and samples, every 0.2 s, the resident memory of each process of its tree
(the driver, Ray's GCS, raylet and helpers, every worker actor, named by its Ray process title). Prints each
process's peak, the sum of those peaks, and the peak of the sum (what the memory goal counts); then start-up
(launch until the first step began: the wall time when step 1's metrics appeared, less that step's own
``time/step_s``, read from ``metrics.jsonl``), the median step time, the median of every ``time/*`` metric
(the step's phases: generation, scoring, training, weight sync...), the train accuracy of the last tenth of the
steps (when the pipeline logs one), the 1-minute load average at the start and the run's output folder (its
``metrics.jsonl`` stays there).

RSS counts a page in every process that maps it, so the sum counts each torch process's ~250 MiB of shared
library pages (libtorch, the CUDA libraries of PyPI's CUDA wheel) once per process; the summed PSS (from
``/proc/<pid>/smaps_rollup``, shared pages split among their processes) is the memory the run actually holds,
printed beside it. The memory goal counts the RSS sum. Each process's row also gives its peak PSS and whether it
had torch loaded (``libtorch_cpu.so`` mapped: the driver should not, once it carries no torch).

    uv run python benchmarks/bench_memory.py [--config examples/quickstart.yaml] [--output-dir DIR] [overrides...]

Set ``OMP_WAIT_POLICY=PASSIVE`` (roll's Ray sets it for its workers; this script sets it for the driver too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def _name(proc: psutil.Process) -> str:
    """A short label: the Ray process title (``ray::RewardWorker``) or the program and its first argument."""
    cmd = proc.cmdline()
    if cmd and cmd[0].startswith("ray::"):
        return cmd[0].split(".")[0].split()[0]
    parts = [Path(c).name for c in cmd[:3] if not c.startswith("-")]
    return " ".join(parts)[:40] or proc.name()


def _pss(pid: int) -> int:
    """Proportional set size in bytes (shared pages divided among the processes mapping them), 0 if unreadable."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def _has_torch(pid: int) -> bool:
    """Whether the process has torch loaded (its C++ library mapped); False if unreadable."""
    with contextlib.suppress(OSError):
        return "libtorch_cpu.so" in Path(f"/proc/{pid}/maps").read_text()
    return False


def _sample(
    root: psutil.Process,
    peaks: dict[int, tuple[str, int]],
    pss: list[int],
    extra: dict[int, tuple[int, bool]],
) -> int:
    """Record each process's RSS into ``peaks`` (pid -> (name, peak)); return the summed RSS now. ``pss``
    receives the summed PSS now (one value per sample); ``extra`` each process's (peak PSS, torch loaded)."""
    total = pss_total = 0
    with contextlib.suppress(psutil.NoSuchProcess):
        procs = [root, *root.children(recursive=True)]
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                rss, own_pss = p.memory_info().rss, _pss(p.pid)
                total += rss
                pss_total += own_pss
                name, peak = peaks.get(p.pid, ("", 0))
                if not name.startswith("ray::") or name == "ray::IDLE":
                    name = _name(p)  # a Ray worker takes its actor's title once the actor starts
                peaks[p.pid] = (name, max(peak, rss))
                peak_pss, torch_seen = extra.get(p.pid, (0, False))
                extra[p.pid] = (max(peak_pss, own_pss), torch_seen or _has_torch(p.pid))
    pss.append(pss_total)
    return total


def _first_step_at(metrics: Path) -> bool:
    return metrics.exists() and any(json.loads(line)["step"] > 0 for line in metrics.read_text().splitlines())


def _no_plot(config: Path) -> list[str]:
    """``plot=false`` where the pipeline draws one (rlvr); other pipelines' configs have no such key."""
    from roll.core.cli import load_run_config

    return ["plot=false"] if "plot" in type(load_run_config(config, [])[1]).model_fields else []


def run(config: Path, overrides: list[str], out: Path | None = None) -> dict[str, object]:
    out = out or Path(tempfile.mkdtemp(prefix="roll-memory-"))
    cmd = [
        sys.executable, "-m", "roll.core.cli", "train", str(config), f"output_dir={out}",
        "tracking.progress=false", *_no_plot(config), *overrides,
    ]  # fmt: skip
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    load = os.getloadavg()[0]
    peaks: dict[int, tuple[str, int]] = {}
    extra: dict[int, tuple[int, bool]] = {}
    peak_sum, first_seen, pss = 0, None, [0]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env)
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        peak_sum = max(peak_sum, _sample(root, peaks, pss, extra))
        if first_seen is None and _first_step_at(out / "metrics.jsonl"):
            first_seen = time.perf_counter() - start
        time.sleep(0.2)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"roll train failed with {proc.returncode}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r["metrics"] for r in rows if r["step"] > 0]
    tenth = max(1, len(rl) // 10)
    acc = [r["reward/accuracy"] for r in rl[-tenth:] if "reward/accuracy" in r]
    return {
        "load": load, "wall_s": wall, "peak_sum": peak_sum, "peaks": peaks, "extra": extra, "peak_pss": max(pss),
        "startup_s": (first_seen or wall) - rl[0]["time/step_s"],
        "step1_s": rl[0]["time/step_s"],
        "step_s": statistics.median(r["time/step_s"] for r in rl[1:] or rl),
        "acc_last": sum(acc) / len(acc) if acc else float("nan"),
        "phases": phase_medians(rl), "out": out,
    }  # fmt: skip


def phase_medians(steps: list[dict[str, float]]) -> dict[str, float]:
    """The median over the steps of each ``time/*`` metric (seconds), in the order they first appear."""
    keys = dict.fromkeys(k for m in steps for k in m if k.startswith("time/"))
    return {k: statistics.median(m[k] for m in steps if k in m) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "quickstart.yaml")
    parser.add_argument(
        "--output-dir", type=Path, default=None, help="the run's output_dir (default: a temp dir)"
    )
    args, overrides = parser.parse_known_args()
    r = run(args.config, overrides, args.output_dir)
    peaks: dict[int, tuple[str, int]] = r["peaks"]  # type: ignore[assignment]
    print(f"load (1 min) at start: {r['load']:.2f}; overrides: {' '.join(overrides) or '(none)'}")
    extra: dict[int, tuple[int, bool]] = r["extra"]  # type: ignore[assignment]
    print("| process | pid | peak RSS MiB | peak PSS MiB | torch loaded |")
    print("|---|---|---|---|---|")
    for pid, (name, peak) in sorted(peaks.items(), key=lambda kv: -kv[1][1]):
        if peak >= 20 * MIB:
            peak_pss, torch_seen = extra.get(pid, (0, False))
            print(
                f"| {name} | {pid} | {peak / MIB:.0f} | {peak_pss / MIB:.0f} | {'yes' if torch_seen else 'no'} |"
            )
    small = [p for _, p in peaks.values() if p < 20 * MIB]
    print(f"| {len(small)} processes under 20 MiB | | {sum(small) / MIB:.0f} |")
    print(f"| **sum of per-process peaks** | | {sum(p for _, p in peaks.values()) / MIB:.0f} |")
    print(f"| **peak of the sum** | | {r['peak_sum'] / MIB:.0f} |")  # type: ignore[operator]
    print(f"| peak of the summed PSS (shared library pages counted once) | | {r['peak_pss'] / MIB:.0f} |")  # type: ignore[operator]
    print()
    print(
        "| start-up s (launch to first step) | first step s | median step s | wall s | train acc (last tenth) |"
    )
    print("|---|---|---|---|---|")
    print(
        f"| {r['startup_s']:.1f} | {r['step1_s']:.2f} | {r['step_s']:.3f} | {r['wall_s']:.0f} "
        f"| {r['acc_last']:.3f} |"
    )
    phases: dict[str, float] = r["phases"]  # type: ignore[assignment]
    print()
    print("| phase | median s over the steps |")
    print("|---|---|")
    for key, seconds in phases.items():
        print(f"| {key} | {seconds:.3f} |")
    print(f"\nmetrics: {r['out']}/metrics.jsonl")


if __name__ == "__main__":
    main()
