"""What a person watching ``roll train`` sees, in one real run: the quickstart made tiny (no warm-up, 4 prompts x 4
samples, 4 new tokens, 3 steps, evaluation after step 2), run as ``roll train`` in a subprocess on the session's
Ray with its stderr on a pseudo-terminal (so the progress line draws, as in a terminal) and its stdout on a pipe.

Asserted: the run dir at start and end; every stdout step line short; the progress line with a parseable ETA;
``samples.jsonl`` rows at steps 1 and 2 only (``log_samples_every: 2``), all 16 rows of a step (count 16), whose
mean reward is the step's ``reward/mean``; eval rows (``kind: eval``) at step 2 whose mean ``correct`` is
``eval/accuracy``; the TensorBoard text tags; the closing lines under 120 characters.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from roll.core.samples import read_samples
from roll.core.testing import read_metrics

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600
MAX_KEYS = 8
DURATION = r"\d+:\d\d(?::\d\d)?"


def tiny_quickstart(tmp_path: Path) -> Path:
    data = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    data.update(
        output_dir=str(tmp_path / "run"), max_steps=3, eval_every=2, plot=False, warmup=None,
        tracking={"backends": ["stdout", "jsonl", "tensorboard"], "log_samples_every": 2, "log_samples_count": 16},
        batch={"prompts_per_step": 4, "samples_per_prompt": 4, "micro_batch_samples": 16},
        rollout={"max_new_tokens": 4, "request_prompts": 4, "temperature": 1.0},
        validation={"num_prompts": 4, "max_new_tokens": 4},
    )  # fmt: skip
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_on_a_terminal(cfg: Path, ray_address: str) -> tuple[int, str, str]:
    """``roll train cfg``: exit code, stdout (a pipe) and stderr (a pseudo-terminal, as a person sees it)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # a 160-column terminal
    cmd = [
        sys.executable,
        "-m",
        "roll.core.cli",
        "train",
        str(cfg),
        f"ray.address={ray_address}",
        "ray.num_cpus=null",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=cfg.parent, env=env, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    stdout, _ = proc.communicate(timeout=TIMEOUT_S)
    reader.join(timeout=30)
    os.close(master)
    return proc.returncode, stdout, b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_a_run_shows_progress_samples_and_a_short_summary(ray_local: Any, tmp_path: Path) -> None:
    cfg = tiny_quickstart(tmp_path)
    code, out, err = run_on_a_terminal(cfg, ray_local.address)
    run_dir = (tmp_path / "run").resolve()
    assert code == 0, out[-3000:] + err[-3000:]

    # start: the run dir, absolute
    assert f"roll: run dir {run_dir}\r\n" in err

    # progress: a line redrawn in place, step/total, elapsed and a parseable ETA
    drawn = [part for part in re.split(r"[\r\n]+", err) if re.match(r"rlvr \d/3 ", part)]
    assert any(part.startswith("rlvr 3/3 ") for part in drawn), err[-2000:]
    etas = [re.search(rf"elapsed ({DURATION}), eta ({DURATION})", part) for part in drawn if "/3 " in part]
    assert any(match is not None for match in etas), drawn

    # stdout: one short line per step, at most MAX_KEYS metrics each
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in steps] == ["step 1/3", "step 2/3", "step 3/3"]
    assert all(len(line.split(" | ")) - 1 <= MAX_KEYS for line in steps), steps
    assert "eval/accuracy" in steps[1] and "reward/mean" in steps[0]

    # samples: steps 1 and 2 (every 2, and step 1), all 16 rows; rewards are the metrics' rewards
    metrics = read_metrics(run_dir)
    rows = read_samples(run_dir / "samples.jsonl")
    train = [r for r in rows if r["kind"] == "train"]
    assert sorted({r["step"] for r in train}) == [1, 2] and len(train) == 32
    for step in (1, 2):
        mine = [r for r in train if r["step"] == step]
        assert set(mine[0]) >= {"prompt", "response", "reward", "score", "ground_truth", "correct", "tag"}
        assert sum(r["reward"] for r in mine) / 16 == pytest.approx(metrics[step]["reward/mean"], abs=1e-6)
        assert sum(r["correct"] for r in mine) / 16 == pytest.approx(
            metrics[step]["reward/accuracy"], abs=1e-6
        )
    evals = [r for r in rows if r["kind"] == "eval"]
    assert {r["step"] for r in evals} == {2} and len(evals) == 4  # all 4 held-out prompts (count 16 > 4)
    assert sum(r["correct"] for r in evals) / 4 == pytest.approx(metrics[2]["eval/accuracy"], abs=1e-6)
    assert all(r["prompt"].startswith("What is ") for r in rows)

    # TensorBoard: the samples as text at those steps
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    assert [e.step for e in acc.Tensors("samples/train/text_summary")] == [1, 2]
    assert [e.step for e in acc.Tensors("samples/eval/text_summary")] == [2]

    # end: a few short lines naming the run dir and what it holds
    closing = out[out.index("roll: done: ") :].splitlines()
    assert 3 <= len(closing) <= 6 and all(len(line) < 120 for line in closing), closing
    assert closing[0].startswith("roll: done: rlvr, 3 of 3 steps in ")
    assert f"roll: run dir {run_dir}" in closing
    assert any(
        "metrics.jsonl" in line and "samples.jsonl" in line and "checkpoints/step_000003/" in line
        for line in closing
    )
