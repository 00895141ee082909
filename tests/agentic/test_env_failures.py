"""An env that cannot run is loud: ``roll validate`` rejects a misspelled env type or option with its key path, and
a run whose env raises in ``step()`` prints the traceback once and stops non-zero at ``max_error_rate``.

The real run is ``roll train`` (``python -m roll.core.cli``) on the session's Ray with the agentic quickstart made
tiny (no warm-up, 2 groups x 2 envs, 4 new tokens); its env is gymnasium's FrozenLake with a user ``parse``
function that raises, so the exception comes from user code inside ``Env.step`` on an env worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from roll.core.cli import EXIT_CONFIG, main
from roll.core.testing import read_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT_S = 600


def _config(tmp_path: Path, envs: list[dict[str, Any]], **changes: Any) -> Path:
    data = yaml.safe_load((EXAMPLES / "agentic_guess.yaml").read_text())
    data["env_manager"]["envs"] = envs
    data.update(changes)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_validate_rejects_a_misspelled_env_type_and_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unknown type: the installed envs listed and the near name suggested; a wrong option (also one nested in
    countdown's tool wrapper) named by its key path; a correct mix passes."""
    bad = [
        {"type": "guess_directon", "options": {"num_directions": 2}},
        {"type": "frozen_lake", "options": {"sise": 3}},
        {"type": "countdown", "options": {"tools": {"max_tool_call": 2}}},
    ]
    assert main(["validate", str(_config(tmp_path, bad))]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "3 problems in config" in err
    assert "env_manager.envs.0.type" in err and "no roll.env plugin named 'guess_directon'" in err
    assert "installed: " in err and "guess_direction" in err and "did you mean 'guess_direction'?" in err
    assert "env_manager.envs.1.options.sise" in err and "unknown key 'sise'" in err
    assert "env_manager.envs.2.options.tools.max_tool_call" in err and "did you mean 'max_tool_calls'?" in err
    good = [{"type": "frozen_lake", "options": {"size": 3}}, {"type": "countdown"}]
    assert main(["validate", str(_config(tmp_path, good))]) == 0


PARSE = """
def parse(text, env):
    return _lookup(text.strip())


def _lookup(word):
    return {"left": 0, "down": 1, "right": 2, "up": 3}[word]
"""


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_an_env_whose_step_raises_prints_its_traceback_and_stops(ray_local: Any, tmp_path: Path) -> None:
    """Every episode's first ``step`` raises KeyError in the user's ``parse``: ``env/errors`` is 1.0 (4 of 4
    episodes) at steps 1 and 2, nothing is trained (``actor/updates`` 0), the traceback (with the user's frames)
    is printed once, and the 2-step window stops the run with exit code 1 and one message naming the cause."""
    (tmp_path / "my_env.py").write_text(PARSE)
    env = {
        "type": "gymnasium",
        "options": {"env_id": "FrozenLake-v1", "parse": f"{tmp_path / 'my_env.py'}:parse"},
    }
    cfg = _config(
        tmp_path, [env], output_dir=str(tmp_path / "run"), max_steps=4, warmup=None, plot=False,
        tracking={"backends": ["jsonl"], "progress": False}, failures={"error_window": 2},
        batch={"prompts_per_step": 2, "samples_per_prompt": 2, "micro_batch_samples": 4},
    )  # fmt: skip
    data = yaml.safe_load(cfg.read_text())
    data["rollout"] = {**data.get("rollout", {}), "max_new_tokens": 4}
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    cmd = [sys.executable, "-m", "roll.core.cli", "train", str(cfg), f"ray.address={ray_local.address}"]
    done = subprocess.run(
        [*cmd, "ray.num_cpus=null"], cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1"),
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert out.count("Traceback (most recent call last)") == 1, out[-5000:]
    assert "env gymnasium failed (KeyError)" in out and "in _lookup" in out and "in parse" in out
    errors = [line for line in out.splitlines() if line.startswith("roll: error:")]
    assert (
        len(errors) == 1
        and "stopped after step 2: env/errors averaged 1.00 over the last 2 steps" in errors[0]
    )
    assert "First error: env gymnasium: KeyError" in errors[0] and "at turn 1, episode seed" in errors[0]
    metrics = read_metrics(tmp_path / "run")
    assert sorted(metrics) == [1, 2]
    assert all(m["env/errors"] == 1.0 and m["actor/updates"] == 0.0 for m in metrics.values())
