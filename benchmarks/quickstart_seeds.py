"""The quickstart's figures over seeds: `roll train examples/quickstart.yaml seed=S` for S = 0, 1, 2, one after the
other, and a table of what each run logged.

Per seed: held-out accuracy after the SFT warm-up (the step-0 evaluation, before any RL) and at the last step,
the train reward averaged over the first and the last ``--window`` steps, wall time of the whole command (start-up,
warm-up and RL), and the 1-minute load average before and after the run; then the mean and the range (min-max)
of each column. One seed is an anecdote: the README and docs/benchmarks.md quote the mean and range printed here.

    uv run python benchmarks/quickstart_seeds.py                       # seeds 0 1 2
    uv run python benchmarks/quickstart_seeds.py --seeds 0,1 max_steps=60   # extra arguments are overrides

Runs are sequential (each uses both cores); ``OMP_WAIT_POLICY=PASSIVE`` is set, as on every benchmark. A run that
fails stops the script with its exit status.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


@dataclass(frozen=True)
class SeedRun:
    """What one seed's run logged: held-out accuracy at step 0 and at the end, train reward first/last window."""

    seed: int
    eval_start: float
    eval_end: float
    train_start: float
    train_end: float
    wall_s: float
    load_before: float
    load_after: float
    eval_count: int


def run_seed(seed: int, overrides: list[str], window: int) -> SeedRun:
    out = Path(tempfile.mkdtemp(prefix=f"roll-quickstart-seed{seed}-"))
    cmd = [sys.executable, "-m", "roll.core.cli", "train", str(QUICKSTART), f"seed={seed}"]
    cmd += [f"output_dir={out}", "tracking.progress=false", *overrides]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, check=False)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"seed {seed}: roll train exited {proc.returncode}; outputs in {out}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return summarize(seed, rows, window, wall, load_before, os.getloadavg()[0])


def summarize(
    seed: int, rows: list[dict], window: int, wall: float, load_before: float, load_after: float
) -> SeedRun:
    """One seed's row from its ``metrics.jsonl`` rows (``{"step": int, "metrics": {...}}``)."""
    evals = {r["step"]: r["metrics"] for r in rows if "eval/accuracy" in r["metrics"]}
    if 0 not in evals:
        raise SystemExit(f"seed {seed}: no step-0 evaluation logged (is eval_every > 0 and warmup set?)")
    rewards = [r["metrics"]["reward/mean"] for r in rows if r["step"] > 0 and "reward/mean" in r["metrics"]]
    last = max(evals)
    count = evals[last].get("eval/domain/arithmetic/count", float("nan"))
    return SeedRun(
        seed=seed,
        eval_start=evals[0]["eval/accuracy"],
        eval_end=evals[last]["eval/accuracy"],
        train_start=statistics.fmean(rewards[:window]),
        train_end=statistics.fmean(rewards[-window:]),
        wall_s=wall,
        load_before=load_before,
        load_after=load_after,
        eval_count=int(count) if count == count else -1,
    )


def table(runs: list[SeedRun], window: int) -> str:
    head = (
        f"| seed | held-out acc, step 0 | held-out acc, end | rise | train reward, first {window} | "
        f"train reward, last {window} | wall s | load before / after |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(
            f"| {r.seed} | {r.eval_start:.3f} | {r.eval_end:.3f} | {r.eval_end - r.eval_start:+.3f} | "
            f"{r.train_start:.3f} | {r.train_end:.3f} | {r.wall_s:.0f} | {r.load_before:.1f} / {r.load_after:.1f} |"
        )
    cols = {
        "held-out acc, step 0": [r.eval_start for r in runs],
        "held-out acc, end": [r.eval_end for r in runs],
        "rise": [r.eval_end - r.eval_start for r in runs],
        "train reward, start": [r.train_start for r in runs],
        "train reward, end": [r.train_end for r in runs],
        "wall s": [r.wall_s for r in runs],
    }
    lines.append("")
    for name, values in cols.items():
        lines.append(
            f"{name}: mean {statistics.fmean(values):.3f}, range {min(values):.3f}-{max(values):.3f}"
        )
    lines.append(f"held-out prompts per evaluation: {sorted({r.eval_count for r in runs})}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated, run in this order")
    parser.add_argument("--window", type=int, default=10, help="steps averaged for the train reward")
    args, overrides = parser.parse_known_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M %Z')}, cores {os.cpu_count()}, overrides {overrides}", flush=True)
    runs = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        runs.append(run_seed(seed, overrides, args.window))
        print(table(runs, args.window), flush=True)


if __name__ == "__main__":
    main()
