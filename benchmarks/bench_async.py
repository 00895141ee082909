"""RLVR's async mode against its sync mode on the quickstart, side by side in one run (issue 16, goal 4).

``sync``: the quickstart with ``placement=separate`` (generation, then scoring, then
training, in turn; each model worker may use both cores, ``cpu_threads: 2``): async needs the generator in its own
actor, so this is the same layout without the overlap. ``sync-hybrid``: the quickstart as it is (one actor trains
and generates, in turn, and cannot overlap them), the fastest sync layout on CPU. ``async``: ``rollout.async_generation_ratio=1`` (the next batch generates while
this one trains, at most one policy version stale) with ``cpu_threads=1``, since trainer and generator now run at
once on the 2 cores. ``async-tis``: the same with ``algorithm.tis_cap=2``: each token's loss weighted by
``min(pi_trainer / pi_generator, 2)``, the truncated importance weight that corrects for the one version of
staleness (with one optimizer step per rollout the trainer's ratio is otherwise 1 and the staleness goes
uncorrected). The sides run the same seed, steps and learning rate; each side is one ``roll train`` subprocess
(peak RSS summed over its process tree). Sides alternate over ``--rounds`` (sync first in odd rounds). Reported
per side and round: the median ``time/step_s`` after the first ``--skip`` RL steps (start-up and the first
generation excluded), the train accuracy of the last tenth of the steps, wall time, peak RSS, and the 1-minute
load average seen while the side ran (min-max). The ratios are each sync side's median step time over async's (each the median of
the side's per-round medians). Quote it only when the load column stays under 1.5 on 2 cores.

Why the ceiling is low on this box: overlapping generation with training hides at most the shorter of the two
phases, and on 2 cores the two phases share the same cores (async halves each worker's threads), so the gain is
bounded by how much of each phase is not compute (Python overhead, waiting on Ray) rather than by the phase
lengths as on a GPU cluster, where generation and training run on separate devices. The load column also reads
higher for async by construction: its trainer and generator are both runnable at once.

    uv run python benchmarks/bench_async.py [--rounds 2] [overrides...]     # e.g. max_steps=40
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_placement import run_quickstart

SIDES = {
    "sync": ["placement=separate"],
    "sync-hybrid": ["placement=hybrid"],
    "async": ["placement=separate", "rollout.async_generation_ratio=1", "cpu_threads=1"],
    "async-tis": [
        "placement=separate",
        "rollout.async_generation_ratio=1",
        "cpu_threads=1",
        "algorithm.tis_cap=2",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip", type=int, default=3, help="RL steps left out of the median (start-up)")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for both sides")
    args = parser.parse_args()
    rows: list[tuple[str, int, dict[str, float]]] = []
    for rnd in range(1, args.rounds + 1):
        order = list(SIDES) if rnd % 2 else list(reversed(SIDES))
        for side in order:
            r = run_quickstart(side, [*SIDES[side], *args.overrides], skip_steps=args.skip)
            rows.append((side, rnd, r))
    print(
        "| side | round | load (min-max) | wall s | peak RSS GiB | median step s | train acc (last tenth) |"
    )
    print("|---|---|---|---|---|---|---|")
    for side, rnd, r in rows:
        print(
            f"| {side} | {rnd} | {r['load_min']:.2f}-{r['load_max']:.2f} | {r['wall_s']:.0f} "
            f"| {r['peak_gib']:.2f} | {r['step_s']:.3f} | {r['acc_last']:.3f} |"
        )
    med = {s: statistics.median(r["step_s"] for side, _, r in rows if side == s) for s in SIDES}
    for sync in ("sync", "sync-hybrid"):
        for asy in ("async", "async-tis"):
            print(f"{sync} / {asy} median step time: {med[sync] / med[asy]:.2f}x (above 1: {asy} is faster)")


if __name__ == "__main__":
    main()
