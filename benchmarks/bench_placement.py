"""The quickstart with ``placement=separate`` (trainer and generator in their own Ray actors) against
``placement=hybrid`` (one actor holds both; weights sync in process; the quickstart's), side by side in one run.

Each side runs `roll train examples/quickstart.yaml` as a subprocess, with the same overrides, and the script
samples the summed resident memory of its whole process tree. It prints wall time, peak RSS, the median RL step
time (`time/step_s`), the train accuracy of the last tenth of the steps, and the 1-minute load average seen while each
side ran (min-max). Ratios are only worth quoting from a quiet machine (load under 1.5 on 2 cores).

    uv run python benchmarks/bench_placement.py [overrides...]      # e.g. max_steps=30
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_grpo_vs_trl import run_measured

ROOT = Path(__file__).resolve().parents[1]


def run_quickstart(label: str, overrides: list[str], skip_steps: int = 0) -> dict[str, float]:
    """One ``roll train examples/quickstart.yaml`` with ``overrides``: its wall time, peak summed RSS, the load
    average (min and max, sampled every 0.5 s), the median ``time/step_s`` after the first ``skip_steps`` RL
    steps, and the train accuracy of the last tenth of the steps."""
    out = Path(tempfile.mkdtemp(prefix=f"roll-bench-{label}-"))
    cmd = [
        sys.executable, "-m", "roll.core.cli", "train", str(ROOT / "examples" / "quickstart.yaml"),
        f"output_dir={out}", "tracking.progress=false", "plot=false", *overrides,
    ]  # fmt: skip
    loads: list[float] = []
    wall, peak = run_measured(cmd, dict(os.environ), loads)
    rows = [json.loads(line)["metrics"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if "time/step_s" in r]
    tenth = max(1, len(rl) // 10)
    return {
        "load_min": min(loads, default=0.0),
        "load_max": max(loads, default=0.0),
        "wall_s": wall,
        "peak_gib": peak / 2**30,
        "step_s": statistics.median(r["time/step_s"] for r in rl[skip_steps:]),
        "acc_last": sum(r["reward/accuracy"] for r in rl[-tenth:]) / tenth,
    }


def main() -> None:
    overrides = sys.argv[1:]
    results = {p: run_quickstart(p, [f"placement={p}", *overrides]) for p in ("separate", "hybrid")}
    print("| placement | load | wall s | peak RSS GiB | median step s | train acc (last tenth) |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['load_min']:.2f}-{r['load_max']:.2f} | {r['wall_s']:.0f} | {r['peak_gib']:.2f} | {r['step_s']:.3f} "
            f"| {r['acc_last']:.3f} |"
        )
    s, h = results["separate"], results["hybrid"]
    print(
        f"hybrid / separate: peak RSS {h['peak_gib'] / s['peak_gib']:.2f}x, step time {h['step_s'] / s['step_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
