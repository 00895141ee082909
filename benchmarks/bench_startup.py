"""Where the time before the first RL step goes: an rlvr run in this process, its phases timed.

Wraps the pipeline's own methods with timers (nothing else changes) and prints, for each phase, when it began and
ended after launch: the driver's imports, Ray's start with the placement groups, the prompt and warm-up data
preparation, the actors' start and ``setup`` (imports, model loads; the roles start in parallel), the SFT warm-up,
and the first two steps. Start-up times depend on load: the load average is printed with them.

    uv run python benchmarks/bench_startup.py [--config examples/quickstart.yaml] [overrides...]
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from pathlib import Path
from typing import Any

T0 = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
MARKS: list[tuple[str, float, float]] = []


def timed(owner: Any, attr: str, label: str) -> None:
    """Replace ``owner.attr`` by a wrapper that records ``(label, start, end)`` seconds after launch."""
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            MARKS.append((label, start - T0, time.perf_counter() - T0))

    setattr(owner, attr, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "quickstart.yaml")
    args, overrides = parser.parse_known_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    load = os.getloadavg()[0]
    start = time.perf_counter()
    import roll.core.run as base
    import roll.pipelines.policy.group as group
    import roll.pipelines.rlvr.pipeline as rlvr
    from roll.core.config.loader import load_tree, validate
    from roll.pipelines.rlvr import SPEC

    MARKS.append(("driver imports", start - T0, time.perf_counter() - T0))
    timed(base.Run, "_start_runtime", "Ray start + placement groups")
    timed(rlvr.RLVRRecipe, "setup", "setup (data, then actors)")
    timed(rlvr, "prepare_data", "  prepare_data")
    timed(group.PolicyGroup, "start", "  actors start + setup")
    timed(rlvr.RLVRRecipe, "warm_up", "SFT warm-up")
    timed(rlvr.RLVRRecipe, "train_step", "train step")
    out = tempfile.mkdtemp(prefix="roll-startup-")
    fixed = [f"output_dir={out}", "max_steps=2", "eval_every=0", "tracking.progress=false", "plot=false"]
    tree = load_tree(args.config, [*fixed, *overrides], model=SPEC.config_model)
    pipeline = SPEC.build(validate(tree, SPEC.config_model))
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    print(f"\nload (1 min) at start: {load:.2f}, at the end: {os.getloadavg()[0]:.2f}")
    print("| phase | from s | to s | took s |")
    print("|---|---|---|---|")
    for label, begin, end in MARKS:
        print(f"| {label} | {begin:.1f} | {end:.1f} | {end - begin:.1f} |")


if __name__ == "__main__":
    main()
