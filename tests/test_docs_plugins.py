"""The plugin guides are enough to write a plugin: the packages shown in docs/rewards.md and docs/environments.md
(their ``# file: <path>`` code blocks, nothing else) are assembled, installed with uv into a scratch directory as a
user's ``pip install`` would, found through their entry points, and run; the configs the pages show for them
validate with roll's loader (and, for the reward, its pre-flight check of the options).

Each check runs in a subprocess that puts the scratch directory on PYTHONPATH, so this process's plugin cache never
sees the installed packages.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _files(page: str) -> dict[str, str]:
    """``{path: text}`` of the page's code blocks whose first line is ``# file: <path>``."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    files = {}
    for block in re.findall(r"^```(?:toml|python)\n(.*?)^```", text, flags=re.S | re.M):
        first, _, body = block.partition("\n")
        if first.startswith("# file: "):
            files[first.removeprefix("# file: ").strip()] = body
    return files


def _yaml_using(page: str, needle: str) -> str:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"^```yaml\n(.*?)^```", text, flags=re.S | re.M) if needle in b]
    return block


def _install(page: str, tmp: Path) -> Path:
    files = _files(page)
    assert {"pyproject.toml"} < set(files), f"{page} shows no complete package: {sorted(files)}"
    package = tmp / "pkg"
    for rel, body in files.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(body, encoding="utf-8")
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH; this test installs the documented package with uv")
    site = tmp / "site"
    cmd = [uv, "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(package)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return site


def _run(site: Path, code: str, tmp: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


REWARD = r"""
import json, pathlib, sys
from roll.core import plugins
from roll.core.cli import load_run_config
from roll.core.errors import ConfigError
from roll.pipelines.rewards.types import RewardRequest

info = plugins.available("roll.reward")["length_target"]
spec = plugins.load("roll.reward", "length_target")
reward = spec.build(spec.config_model(target_words=4, tolerance=4))
results = reward.score([RewardRequest("one two three four", ground_truth="x"), RewardRequest("one two"),
                        RewardRequest("")])
cfg = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else None
snippet = pathlib.Path(TMP) / "reward.yaml"
snippet.write_text("defaults: [" + str(pathlib.Path("examples/quickstart.yaml").resolve()) + "]\n" + YAML)
_, config = load_run_config(snippet, [], preflight=True)
try:
    load_run_config(snippet, ["rewards.arithmetic.options.tolerance=0"], preflight=True)
    bad = "accepted"
except ConfigError as exc:
    bad = str(exc)
print(json.dumps({"dist": info.dist, "scores": [r.score for r in results],
                  "info": [r.info for r in results], "type": config.rewards["arithmetic"].type, "bad": bad}))
"""


def test_the_reward_guide_builds_a_working_plugin(tmp_path: Path) -> None:
    site = _install("rewards.md", tmp_path)
    code = f"TMP = {str(tmp_path)!r}\nYAML = {_yaml_using('rewards.md', 'length_target')!r}\n{REWARD}"
    result = _run(site, code, tmp_path)
    assert result["dist"] == "roll-reward-length"
    # 4 words at target 4: 1.0 and correct; 2 words, 2 off with tolerance 4: 0.5; empty: a failed row, score 0
    assert result["scores"] == [1.0, 0.5, 0.0]
    assert result["info"][0] == {"words": 4, "correct": True} and "error" in result["info"][2]
    assert result["type"] == "length_target"
    assert "tolerance" in result["bad"] and "greater than or equal to 1" in result["bad"]


ENV = r"""
import json, pathlib
from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.config import EnvEntryConfig, EnvManagerConfig
from roll.agentic.env_manager.manager import Generation, RolloutManager
from roll.agentic.env_manager.slots import EnvSlots, factory_for
from roll.core import plugins
from roll.core.cli import load_run_config
from roll.core.errors import ConfigError
from roll.data.tokenizer import build_tokenizer

info = plugins.available("roll.env")["parity"]
encoder = ChatEncoder(build_tokenizer("roll-tiny"))

def reader(prompts, *, seed):
    # A policy that reads the last number off the prompt and answers its parity: every episode should succeed.
    out = []
    for prompt in prompts:
        number = int(encoder.decode(prompt).rsplit("The number is ", 1)[1].split(".")[0])
        ids = encoder.encode("<answer>" + ("Even" if number % 2 == 0 else "Odd") + "</answer>") + [encoder.eos_token_id]
        out.append(Generation(ids, [0.0] * len(ids)))
    return out

snippet = pathlib.Path(TMP) / "env.yaml"
snippet.write_text("defaults: [" + str(pathlib.Path("examples/agentic_frozen_lake.yaml").resolve()) + "]\n" + YAML)
_, config = load_run_config(snippet, [], preflight=True)
try:
    load_run_config(snippet, ["env_manager.envs.0.options.rounds=0"], preflight=True)
    bad = "accepted"
except ConfigError as exc:
    bad = str(exc)
manager = config.env_manager
pool = EnvSlots(16, factory_for(manager.envs), timeout_s=10)  # the example starts an extra group
rollout = RolloutManager(manager, pool, reader, encoder, max_new_tokens=config.rollout.max_new_tokens).rollout(4, 2, batch_seed=3)
print(json.dumps({"dist": info.dist, "metrics": rollout.metrics(),
                  "returns": sorted({e.total_reward for e in rollout.episodes}), "bad": bad}))
"""


def test_the_env_guide_builds_a_working_plugin(tmp_path: Path) -> None:
    site = _install("environments.md", tmp_path)
    code = f"TMP = {str(tmp_path)!r}\nYAML = {_yaml_using('environments.md', 'type: parity')!r}\n{ENV}"
    result = _run(site, code, tmp_path)
    assert result["dist"] == "roll-env-parity"
    metrics = result["metrics"]
    # 4 groups x 2 episodes of 3 rounds, every answer right: success 1, return 3, 3 turns each, format kept
    assert metrics["env/parity/success_rate"] == 1.0 and metrics["env/episodes_kept"] == 8.0
    assert metrics["env/return"] == 3.0 and metrics["env/turns"] == 3.0 and metrics["env/format_ok"] == 1.0
    assert result["returns"] == [3.0]
    assert "env_manager.envs.0.options.rounds" in result["bad"]
