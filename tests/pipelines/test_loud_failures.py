"""Runs that cannot learn end non-zero with one message naming the cause, and user-code errors reach the terminal.

Each test is a real ``roll train`` (``python -m roll.core.cli``, its output read as a terminal would show it) on the
session's Ray: the quickstart made tiny (no warm-up, 4 prompts x 4 samples, 4 new tokens), with its reward swapped
for a user's Python function that this test writes. What a user would see is asserted: the exit code, the one
``roll: error:`` line, the traceback printed exactly once, and the metrics in ``metrics.jsonl``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from roll.core.testing import read_metrics

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600


def tiny_rlvr(tmp_path: Path, reward_source: str, **changes: Any) -> Path:
    """The quickstart made tiny, scored by ``reward`` in a file this writes; ``changes`` are top-level keys."""
    (tmp_path / "my_rewards.py").write_text(reward_source)
    data = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    data.update(
        output_dir=str(tmp_path / "run"), max_steps=3, eval_every=0, plot=False, warmup=None,
        tracking={"backends": ["jsonl"], "progress": False},
        batch={"prompts_per_step": 4, "samples_per_prompt": 4, "micro_batch_samples": 16},
        rollout={"max_new_tokens": 4, "request_prompts": 4},
        rewards={"arith": {"type": "python", "options": {"function": f"{tmp_path / 'my_rewards.py'}:reward"},
                           "workers": {"num_workers": 1, "cpus_per_worker": 0.25}}},
        **changes,
    )  # fmt: skip
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def roll_train(cfg: Path, ray_address: str, *overrides: str) -> tuple[int, str]:
    """``roll train cfg`` in a subprocess on the session's Ray: exit code and everything it printed."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "roll.core.cli", "train", str(cfg), f"ray.address={ray_address}"]
    done = subprocess.run(
        [*cmd, "ray.num_cpus=null", *overrides], cwd=cfg.parent, env=env, capture_output=True, text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_a_nan_reward_stops_the_run_naming_reward_row_and_value(ray_local: Any, tmp_path: Path) -> None:
    """Every row scores NaN: each is an error (``reward/errors`` 1.0 at steps 1 and 2), and once the 2-step
    window is full the run stops non-zero, its one message naming the metric, the reward, the value and a row."""
    cfg = tiny_rlvr(
        tmp_path,
        "def reward(response, ground_truth):\n    return float('nan')\n",
        failures={"error_window": 2},
    )
    code, out = roll_train(cfg, ray_local.address)
    assert code == 1, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("roll: error:")]
    assert len(errors) == 1, out[-3000:]
    line = errors[0]
    assert "stopped after step 2: reward/errors averaged 1.00 over the last 2 steps" in line
    assert "reward arith (python)" in line and "my_rewards.py:reward returned nan (float)" in line
    assert "[row: prompt '" in line and "ground truth '" in line
    metrics = read_metrics(tmp_path / "run")
    assert sorted(metrics) == [1, 2] and all(m["reward/errors"] == 1.0 for m in metrics.values())
    assert all(m["reward/mean"] == 0.0 for m in metrics.values())  # unscored rows score 0, never NaN


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_a_raising_reward_prints_its_traceback_once_and_counts_errors(ray_local: Any, tmp_path: Path) -> None:
    """Every row raises (through a helper, so the traceback has a frame to show): 3 steps x 16 rows = 48 errors,
    the traceback printed once. ``max_error_rate: 1`` lets the run finish, with ``reward/errors`` 1.0 per step.
    The same run caps prompts at 8 tokens, which cuts every arithmetic prompt (the chat template alone is 8):
    one WARNING per split says so, and ``data/prompt_truncated`` is 1.0 each step."""
    source = (
        "def parse(text):\n    return int(text.split()[-1])\n\n"
        "def reward(response, ground_truth):\n    return float(parse(response + ' x') == int(ground_truth))\n"
    )
    cfg = tiny_rlvr(tmp_path, source, failures={"max_error_rate": 1.0}, tokenize={"max_prompt_length": 8})
    code, out = roll_train(cfg, ray_local.address)
    assert code == 0, out[-3000:]
    # The user's traceback, once: counted by its own frame, so a traceback Ray itself prints on a loaded machine
    # (a worker's teardown, say) cannot fail this test or hide a second copy of the user's.
    assert out.count('my_rewards.py", line 2, in parse') == 1, out[-5000:]
    assert out.count("reward arith (python) failed (ValueError)") == 1, out[-5000:]
    assert "invalid literal for int() with base 10: 'x'" in out
    metrics = read_metrics(tmp_path / "run")
    assert sorted(metrics) == [1, 2, 3]
    assert all(m["reward/errors"] == 1.0 and m["data/prompt_truncated"] == 1.0 for m in metrics.values())
    quickstart = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())["data"]
    n_train, n_eval = quickstart["sources"][0]["max_samples"], quickstart["eval_sources"][0]["max_samples"]
    train_line = f"train prompt data: {n_train} of {n_train} rows were longer than the limit"
    assert out.count(train_line) == 1  # once, at WARNING
    assert out.count(f"eval prompt data: {n_eval} of {n_eval} rows were longer than the limit") == 1


BLOW_UP = [
    "actor_train.strategy.optimizer.lr=1e30",  # one Adam step moves every weight by ~1e30: the next forward overflows
    "actor_train.strategy.max_grad_norm=null",
]
VARIED = "def reward(response, ground_truth):\n    return float(len(response) % 3)\n"
"""Scores 0, 1 or 2 by response length: the samples of a group differ, so step 1 has advantages and an update."""


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_a_non_finite_loss_stops_the_run_naming_step_and_role(ray_local: Any, tmp_path: Path) -> None:
    """lr 1e30: step 1 trains (finite loss), its update overflows the weights, and step 2's loss is NaN. The run
    stops at step 2 with exit code 1 naming the role and rank; with ``failures.non_finite=skip`` the same run
    goes on to its last step instead (the update is dropped, as the strategies always did)."""
    cfg = tiny_rlvr(tmp_path, VARIED)
    code, out = roll_train(cfg, ray_local.address, *BLOW_UP)
    assert code == 1, out[-3000:]
    (line,) = [line for line in out.splitlines() if line.startswith("roll: error:")]
    assert "stopped at step 2: role 'actor_train' rank 0 has a non-finite" in line and "loss = nan" in line
    assert "failures.non_finite: skip" in line
    metrics = read_metrics(tmp_path / "run")
    assert sorted(metrics) == [1] and metrics[1]["actor/updates"] == 1.0
    code, out = roll_train(
        cfg, ray_local.address, *BLOW_UP, "failures.non_finite=skip", f"output_dir={tmp_path / 'skip'}"
    )
    assert code == 0, out[-3000:]
    skipped = read_metrics(tmp_path / "skip")
    assert sorted(skipped) == [1, 2, 3] and skipped[2]["actor/updates"] == 0.0


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_a_constant_reward_stops_after_steps_without_updates(ray_local: Any, tmp_path: Path) -> None:
    """Every sample scores 1.0, so every GRPO advantage is 0 and no step moves the policy (``actor/updates`` 0,
    ``reward/std`` 0): with ``max_steps_without_update: 2`` the run stops after step 2, exit code 1, saying why."""
    cfg = tiny_rlvr(
        tmp_path,
        "def reward(response, ground_truth):\n    return 1.0\n",
        failures={"max_steps_without_update": 2},
    )
    code, out = roll_train(cfg, ray_local.address)
    assert code == 1, out[-3000:]
    (line,) = [line for line in out.splitlines() if line.startswith("roll: error:")]
    assert "stopped after step 2: no useful optimizer update in the last 2 steps" in line
    assert "every row's advantage was 0" in line and "reward/std 0" in line
    metrics = read_metrics(tmp_path / "run")
    assert sorted(metrics) == [1, 2] and all(m["actor/updates"] == 0.0 for m in metrics.values())
    assert all(m["reward/errors"] == 0.0 and m["reward/mean"] == 1.0 for m in metrics.values())
