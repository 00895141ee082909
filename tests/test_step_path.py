"""The call path of one GRPO step (``scripts/trace_step_path.py``), as docs/architecture.md describes it.

The driver reaches the cluster through the run loop and the policy group, and the actor trains through the
strategy's ``train_step`` (the one train path: roles and tests share it). The bounds are the frame counts the
architecture page quotes, so a change that lengthens the path has to update the page.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_one_grpo_step_goes_through_the_strategys_train_step_in_at_most_15_frames() -> None:
    run = subprocess.run(
        [sys.executable, "scripts/trace_step_path.py", "examples/quickstart.yaml"],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout
    actor = out.split("actor, train_step -> optimizer.step:")[1].split("total:")[0]
    assert "roll.workers.fsdp2" in actor and "train_step" in actor.split("roll.workers.fsdp2")[1], actor
    total = re.search(r"total: (\d+) roll frames, (\d+) roll modules, (\d+) package switches", out)
    assert total is not None, out
    frames, modules, switches = map(int, total.groups())
    assert frames <= 15 and modules <= 9 and switches <= 3, total.group(0)
