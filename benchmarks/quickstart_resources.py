"""Time and peak memory of the README's main job: `roll train examples/quickstart.yaml`.

Runs the quickstart as a subprocess and samples the summed resident memory of its whole process tree (the driver,
Ray's GCS and raylet, and every worker actor) every half second; prints wall time, peak RSS and the reward curve
it logged. Extra arguments are passed to `roll train` as overrides.

    uv run python benchmarks/quickstart_resources.py [overrides...]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_grpo_vs_trl import run_measured

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    out = Path(tempfile.mkdtemp(prefix="roll-quickstart-"))
    cmd = [
        sys.executable,
        "-m",
        "roll.core.cli",
        "train",
        str(ROOT / "examples" / "quickstart.yaml"),
        f"output_dir={out}",
        "tracking.progress=false",
        *sys.argv[1:],
    ]
    wall, peak = run_measured(cmd, dict(os.environ))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["step"] > 0]
    acc = [r["metrics"]["reward/accuracy"] for r in rl]
    evals = [(r["step"], r["metrics"]["eval/accuracy"]) for r in rl if "eval/accuracy" in r["metrics"]]
    tenth = max(1, len(acc) // 10)
    print(f"| wall time | {wall:.0f} s |")
    print(f"| peak RSS, all processes | {peak / 2**30:.2f} GiB |")
    print(f"| train accuracy, first {tenth} steps | {sum(acc[:tenth]) / tenth:.3f} |")
    print(f"| train accuracy, last {tenth} steps | {sum(acc[-tenth:]) / tenth:.3f} |")
    print(f"| eval accuracy by step | {', '.join(f'{s}: {a:.2f}' for s, a in evals)} |")
    print(f"| outputs | {out} |")


if __name__ == "__main__":
    main()
