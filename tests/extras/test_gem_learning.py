"""The agentic pipeline trains on a GEM game: ``examples/agentic_gem_guess.yaml`` (GuessTheNumber, one turn,
GEM's own reward) made shorter, in hybrid placement on the session's Ray. GEM's reward must rise.

In ``tests/extras`` (needs ``roll-agentic[gem]``). Measured (seed 0): mean return 0.434, 0.330, 0.334, 0.359,
0.445, 0.411, 0.473, 0.490 over the 8 steps (first two 0.382 -> last two 0.482, +0.10; asserted +0.05), format
kept 0.72 -> 0.77, success 0.05-0.09 throughout (a blind guess). 413 s on the 2 shared cores under load ~15, of
which the first step (actor start-up and the 30-step warm-up) took 252 s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from roll.agentic.pipeline.agentic import SPEC, AgenticConfig
from roll.core.config.loader import load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agentic_gem_guess.yaml"
STEPS = 8


@pytest.mark.slow
def test_gem_reward_rises(ray_local: Any, tmp_path: Path) -> None:
    overrides = [
        f"output_dir={tmp_path}",
        f"max_steps={STEPS}",
        "placement=hybrid",
        "plot=false",
        "tracking.backends=[jsonl]",
        "tracking.progress=false",
        "ray.address=auto",
        "ray.num_cpus=null",
    ]
    pipeline = SPEC.build(load_config(EXAMPLE, overrides, model=AgenticConfig))
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r["metrics"] for r in rows if r["step"] > 0 and "env/return" in r["metrics"]]
    returns = [s["env/return"] for s in steps]
    assert len(returns) == STEPS
    first, last = sum(returns[:2]) / 2, sum(returns[-2:]) / 2
    assert last > first + 0.05, f"GEM's reward did not rise: {returns}"
