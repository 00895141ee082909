"""Partial rollout against one-step-ahead async and sync RLVR, per wall-clock second, on two tasks, in one run.

Sides (each a ``roll train`` subprocess of the quickstart with these overrides, same seed, steps and learning rate):

- ``sync``: ``placement=separate``, generation then scoring then training, in turn (each worker may use both
  cores);
- ``step-ahead``: one-step-ahead async (``rollout.async_generation_ratio=1 rollout.async_mode=step_ahead``): the
  next batch generates on this step's weights while it trains, and the sync waits for the whole batch;
- ``partial``: partial rollout in the free-running stream (``rollout.async_mode=stream rollout.partial=true``,
  segments of ``--segment`` tokens): a weight update cuts in between two segments of the samples in flight, which
  continue under the new weights, so a long sample never holds back the update;
- ``partial-step-ahead`` (``--sides`` to add it): the deterministic partial mode (the first segment is made on
  the old weights, the rest after the sync).

Async sides use ``cpu_threads=1`` (trainer and generator run at once on the cores) and
``algorithm.tis_cap=2`` (truncated importance weights from the sampler's per-token log-probs, which partial
rollout records per token, correct for the off-policy tokens).

Tasks: ``quickstart`` (one-digit three-term sums: answers of 2-3 tokens, so lengths barely vary), and ``longtail``:
the same run with ``rollout.max_new_tokens=96`` after a very short warm-up (``warmup.steps=8``): the policy has barely
learned to stop, so most answers end after a few tokens and some run to the cap (at step 1: mean 18.5, max 96), the long tail that makes a
synchronous step wait for its slowest sample. The table prints each side's response length mean and max, so the
spread is visible.

Reported per task, side and round: the 1-minute load average while it ran (min-max), wall s, RL s (the summed
``time/step_s``), steps, median step s, the mean response length and max, aborts per step (partial), train
reward of the last tenth of the steps; then the curve: train reward (mean over a window of steps) against RL
wall-clock seconds, at the same time points for every side of a task. Ratios are worth quoting only from a quiet
machine (load under 1.5 on 2 cores). ``OMP_WAIT_POLICY=PASSIVE`` is set for every side.

How far 2 cores go: generation and training share the same two cores, so overlapping them (any async side) hides
only their non-compute time (Python, Ray waits), never doubles throughput as separate devices would; partial
rollout adds one prefill of prompt + prefix per segment (small next to decoding on a 1M model, but not free), and
what it saves is the wait for the longest sample of a step, which matters only when lengths vary a lot (the
longtail task) and generation is a large share of the step. Expect partial to help on ``longtail`` and to be
level or slightly behind on ``quickstart``.

    uv run python benchmarks/partial_rollout.py [--steps 120] [--rounds 1] [--tasks quickstart,longtail] [overrides...]
    uv run python benchmarks/partial_rollout.py --steps 2 --rounds 1      # a smoke run of every side and task
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_grpo_vs_trl import run_measured

ROOT = Path(__file__).resolve().parents[1]
ASYNC = ["placement=separate", "rollout.async_generation_ratio=1", "cpu_threads=1", "algorithm.tis_cap=2"]
SIDES = {
    "sync": ["placement=separate"],
    "step-ahead": [*ASYNC, "rollout.async_mode=step_ahead"],
    "partial": [*ASYNC, "rollout.async_mode=stream", "rollout.partial=true"],
    "partial-step-ahead": [*ASYNC, "rollout.async_mode=step_ahead", "rollout.partial=true"],
}
TASKS = {
    "quickstart": [],
    "longtail": ["rollout.max_new_tokens=96", "warmup.steps=8"],
}
POINTS = 6  # curve points per task


def run_side(label: str, overrides: list[str]) -> dict[str, Any]:
    """One ``roll train examples/quickstart.yaml``: summary figures and its per-step (RL seconds, reward) curve."""
    out = Path(tempfile.mkdtemp(prefix=f"roll-partial-{label}-"))
    cmd = [
        sys.executable, "-m", "roll.core.cli", "train", str(ROOT / "examples" / "quickstart.yaml"),
        f"output_dir={out}", "tracking.progress=false", "plot=false", "eval_every=0", *overrides,
    ]  # fmt: skip
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    loads: list[float] = []
    wall, _ = run_measured(cmd, env, loads)
    rows = [json.loads(line)["metrics"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if "time/step_s" in r]
    elapsed, curve = 0.0, []
    for r in rl:
        elapsed += r["time/step_s"]
        curve.append((elapsed, r["reward/mean"]))
    tenth = max(1, len(rl) // 10)
    return {
        "load": (min(loads, default=0.0), max(loads, default=0.0)),
        "wall_s": wall,
        "rl_s": elapsed,
        "steps": len(rl),
        "step_s": statistics.median(r["time/step_s"] for r in rl),
        "len_mean": statistics.mean(r["response/length_mean"] for r in rl),
        "len_max": max(r["response/length_max"] for r in rl),
        "aborts": statistics.mean(r.get("rollout/aborts", 0.0) for r in rl),
        "reward_last": sum(r["reward/mean"] for r in rl[-tenth:]) / tenth,
        "curve": curve,
    }


def reward_at(curve: list[tuple[float, float]], t: float, window: int = 5) -> float:
    """Mean train reward of the last ``window`` steps finished by RL second ``t`` (nan before the first)."""
    done = [reward for elapsed, reward in curve if elapsed <= t]
    return statistics.mean(done[-window:]) if done else float("nan")


def print_task(task: str, results: list[tuple[str, int, dict[str, Any]]]) -> None:
    print(f"\n### {task}\n")
    print("| side | round | load (min-max) | wall s | RL s | steps | median step s | length mean / max "
          "| aborts/step | reward (last tenth) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for side, rnd, r in results:
        lo, hi = r["load"]
        print(
            f"| {side} | {rnd} | {lo:.2f}-{hi:.2f} | {r['wall_s']:.0f} | {r['rl_s']:.1f} | {r['steps']} "
            f"| {r['step_s']:.3f} | {r['len_mean']:.1f} / {r['len_max']:.0f} | {r['aborts']:.1f} "
            f"| {r['reward_last']:.3f} |"
        )
    horizon = min(r["rl_s"] for _, _, r in results)
    times = [horizon * (k + 1) / POINTS for k in range(POINTS)]
    print("\nTrain reward against RL wall-clock seconds (mean of the last 5 steps done by then):\n")
    print("| side | round | load max | " + " | ".join(f"{t:.0f} s" for t in times) + " |")
    print("|---|---|---|" + "---|" * len(times))
    for side, rnd, r in results:
        cells = " | ".join(f"{reward_at(r['curve'], t):.3f}" for t in times)
        print(f"| {side} | {rnd} | {r['load'][1]:.2f} | {cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120, help="RL steps per side")
    parser.add_argument("--rounds", type=int, default=1, help="sides alternate order each round")
    parser.add_argument("--segment", type=int, default=32, help="rollout.partial_segment_tokens")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {list(TASKS)}")
    parser.add_argument(
        "--sides", default="sync,step-ahead,partial", help=f"comma-separated, of {list(SIDES)}"
    )
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for every side")
    args = parser.parse_args()
    tasks, sides = args.tasks.split(","), args.sides.split(",")
    unknown = sorted(set(tasks) - set(TASKS)) + sorted(set(sides) - set(SIDES))
    if unknown:
        parser.error(f"unknown task or side {unknown}; tasks: {list(TASKS)}, sides: {list(SIDES)}")
    common = [f"max_steps={args.steps}", f"rollout.partial_segment_tokens={args.segment}", *args.overrides]
    for task in tasks:
        results: list[tuple[str, int, dict[str, Any]]] = []
        for rnd in range(1, args.rounds + 1):
            order = sides if rnd % 2 else list(reversed(sides))
            for side in order:
                overrides = [*SIDES[side], *TASKS[task], *common]
                results.append((side, rnd, run_side(f"{task}-{side}", overrides)))
        print_task(task, results)


if __name__ == "__main__":
    main()
