"""An env shipped by another distribution (tests/fixtures/roll-env-example, entry point ``roll.env: coin_flip``) is
found through the entry point and played by the env manager, exactly as after ``pip install roll-env-example``.

The fixture is installed with uv (no deps) into a scratch directory that a subprocess puts on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "roll-env-example"

PLAY = r"""
import json
from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.config import EnvEntryConfig, EnvManagerConfig
from roll.agentic.env_manager.manager import Generation, RolloutManager
from roll.agentic.env_manager.slots import EnvSlots, factory_for
from roll.core import plugins
from roll.data.tokenizer import build_tokenizer

info = plugins.available("roll.env")["coin_flip"]
encoder = ChatEncoder(build_tokenizer("roll-tiny"))

def reader(prompts, *, seed):
    # A policy that reads the face off the prompt: every episode should succeed.
    out = []
    for prompt in prompts:
        face = "Heads" if "shows Heads" in encoder.decode(prompt) else "Tails"
        ids = encoder.encode(f"<answer>{face}</answer>") + [encoder.eos_token_id]
        out.append(Generation(ids, [0.0] * len(ids)))
    return out

config = EnvManagerConfig(envs=[EnvEntryConfig(type="coin_flip")])
pool = EnvSlots(8, factory_for(config.envs), timeout_s=10)
rollout = RolloutManager(config, pool, reader, encoder, max_new_tokens=32).rollout(4, 2, batch_seed=3)
print(json.dumps({"dist": info.dist, "metrics": rollout.metrics(),
                  "faces": sorted({e.turns[0].action for e in rollout.episodes})}))
"""


@pytest.fixture(scope="module")
def env_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH; the test installs its fixture env with uv")
    target = tmp_path_factory.mktemp("site-env")
    cmd = [uv, "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(FIXTURE)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return target


def test_out_of_tree_env_is_found_and_played(env_site: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(env_site), env.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-c", PLAY], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["dist"] == "roll-env-example"
    assert result["metrics"]["env/coin_flip/success_rate"] == 1.0
    assert result["metrics"]["env/episodes_kept"] == 8.0
    assert result["faces"] == ["Heads", "Tails"]


def test_unknown_env_lists_the_installed_ones() -> None:
    from roll.agentic.env_manager.config import EnvEntryConfig
    from roll.agentic.env_manager.slots import build_env
    from roll.core.errors import PluginError

    with pytest.raises(PluginError, match="frozen_lake"):
        build_env(EnvEntryConfig(type="no_such_env"))
