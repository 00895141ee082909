"""The rlvr reward worker's module imports no torch, so a text reward's Ray process stays small and starts fast.

Checked in a fresh interpreter (this test process already has torch): importing the worker module and building
and scoring the arithmetic reward through it leaves ``torch`` out of ``sys.modules``.
"""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import sys
from roll.core.cluster import WorkerContext
from roll.pipelines.rlvr.reward_worker import RewardWorker
worker = RewardWorker.__new__(RewardWorker)
RewardWorker.__init__(worker, WorkerContext("reward", 0, 1), "arithmetic", {})
out = worker.score({"text": ["The answer is 7.", "The answer is 3."], "ground_truth": ["7", "7"], "tag": ["a", "a"]})
print(out["scores_B"], "torch" in sys.modules)
"""


def test_reward_worker_scores_without_importing_torch() -> None:
    """Golden: "The answer is 7." against 7 scores 1.0, "... 3." scores 0.0; torch stays unimported."""
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[1.0,", "0.0]", "False"], done.stdout
