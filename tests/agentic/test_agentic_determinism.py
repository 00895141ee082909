"""Two uninterrupted runs of the agentic example log identical metrics, step for step, bit for bit (timing aside).

``examples/agentic_guess.yaml`` made short (hybrid placement, its 16 env groups of 8, a short warm-up), with an
evaluation at step 2 before the last optimizer steps. ``cpu_threads=2`` is kept on purpose: one torch thread
would sum in a fixed order anyway, and the test could not fail (see ``tests/pipelines/test_determinism.py``).
Smaller batches (8 groups of 4) passed on main before the fix too; at this size two runs of main differed from
step 2 (``actor/grad_norm``), as two runs of the full example did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from roll.core.testing import assert_identical_runs, read_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_agentic_twice_gives_identical_metrics(ray_local: Any, tmp_path: Path) -> None:
    from roll.agentic.pipeline.agentic import SPEC, AgenticConfig
    from roll.core.config.loader import load_config

    runs = []
    for name in ("first", "second"):
        overrides = [
            f"output_dir={tmp_path / name}",
            "max_steps=4",
            "eval_every=2",
            "warmup.steps=20",
            "placement=hybrid",
            "cpu_threads=2",
            "plot=false",
            "tracking.backends=[jsonl]",
            "tracking.progress=false",
        ]
        pipeline = SPEC.build(load_config(EXAMPLES / "agentic_guess.yaml", overrides, model=AgenticConfig))
        try:
            pipeline.run()
        finally:
            pipeline.shutdown()
        runs.append(read_metrics(tmp_path / name))
    assert_identical_runs(*runs)
    assert "eval/success_rate" in runs[0][2] and "actor/grad_norm" in runs[0][4]
