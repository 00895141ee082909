"""The example plugin packages of ``examples/plugins/`` (one per entry-point group; docs/plugins.md walks through
them) work as a user installs them: built into wheels, installed into a fresh virtual environment that has roll,
and trained with ``roll train <their config.yaml>`` there.

- fast (default suite): every package installed with ``--no-deps --target`` into a scratch directory that a
  subprocess puts on PYTHONPATH (this environment is never changed); ``roll list`` shows each plugin with its
  distribution, ``roll validate`` passes each example config with its pre-flight checks, and a wrong option of each
  is a config error (exit 2) naming its key path.
- slow: ``uv build`` each package, ``uv venv`` + ``uv pip install --offline --no-sources`` the workspace packages
  (copies from their local paths, pinned by ``uv export`` of the lock) and the wheels, then ``roll train`` each config for one step and
  check the file or metric only that plugin makes (the tool-call format: its config's env is built and stepped
  instead, without training).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "plugins"
PACKAGES = ("roll-core", "roll-data", "roll-workers", "roll-pipelines", "roll-agentic")

# example folder -> (distribution, entry-point group, plugin name, a bad override and the key path it must name)
PLUGINS = {
    "reward": ("roll-example-reward", "roll.reward", "keyword", "rewards.arithmetic.options.max_words=0"),
    "env": ("roll-example-env", "roll.env", "higher_lower", "env_manager.envs.0.options.max_number=1"),
    "tool": ("roll-example-tool", "roll.tool", "lookup", "env_manager.envs.0.tools.0.options.nope=1"),
    "tool_parser": (
        "roll-example-tool-parser",
        "roll.tool_parser",
        "pythonic",
        "env_manager.envs.0.tool_calls.format=pythonik",
    ),
    "tracker": ("roll-example-tracker", "roll.tracker", "csv", "tracking.backends=[stdout,cvs]"),
    "strategy": (
        "roll-example-strategy",
        "roll.strategy",
        "hf_capped",
        "actor_infer.strategy.max_new_tokens=0",
    ),
    "pipeline": ("roll-example-pipeline", "roll.pipeline", "best_of_n", "n=1"),
}
BAD_PATHS = {
    "reward": "rewards.arithmetic.options.max_words",
    "env": "env_manager.envs.0.options",
    "tool": "env_manager.envs.0.tools.0.options.nope",
    "tool_parser": "env_manager.envs.0.tool_calls.format",
    "tracker": "tracking.backends.1",
    "strategy": "actor_infer.strategy.max_new_tokens",
    "pipeline": "n",
}


def test_every_example_package_is_listed() -> None:
    folders = sorted(p.name for p in EXAMPLES.iterdir() if (p / "pyproject.toml").exists())
    assert folders == sorted(PLUGINS)
    for name, (dist, group, plugin, _) in PLUGINS.items():
        text = (EXAMPLES / name / "pyproject.toml").read_text(encoding="utf-8")
        assert f'name = "{dist}"' in text and f'[project.entry-points."{group}"]' in text
        assert f"{plugin} = " in text and (EXAMPLES / name / "config.yaml").exists()


def _uv() -> str:
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH; these tests install the example packages with uv")
    return uv


def _run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: int = 600) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False)
    assert out.returncode == 0, (
        f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )
    return out.stdout + out.stderr


# ------------------------------------------------------------------------------------------------ fast


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("plugin-site")
    folders = [str(EXAMPLES / name) for name in PLUGINS]
    _run([_uv(), "pip", "install", "--quiet", "--offline", "--no-deps", "--target", str(site), *folders])
    return site


def _roll(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    code = "import sys; from roll.core.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)


def test_roll_list_shows_every_example_plugin(plugin_site: Path) -> None:
    out = _roll(plugin_site, "list")
    assert out.returncode == 0, out.stderr[-3000:]
    for dist, group, plugin, _ in PLUGINS.values():
        section = out.stdout.split(group, 1)[1]
        line = next(line for line in section.splitlines() if line.strip().startswith(plugin + " "))
        assert dist in line and line.rstrip().endswith(" ok"), line


@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_example_config_validates_and_a_bad_option_names_its_key(plugin_site: Path, name: str) -> None:
    config = str(EXAMPLES / name / "config.yaml")
    good = _roll(plugin_site, "validate", config)
    assert good.returncode == 0, good.stdout[-2000:] + good.stderr[-3000:]
    bad = _roll(plugin_site, "validate", config, PLUGINS[name][3])
    assert bad.returncode == 2, bad.stdout[-2000:] + bad.stderr[-3000:]
    assert BAD_PATHS[name] in bad.stdout + bad.stderr


# ------------------------------------------------------------------------------------------------ slow


@pytest.fixture(scope="module")
def plugin_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with roll (the workspace packages, pinned to the lock) and the seven wheels."""
    uv, tmp = _uv(), tmp_path_factory.mktemp("plugin-venv")
    wheels = tmp / "wheels"
    for name in PLUGINS:
        _run([uv, "build", "--offline", "--quiet", "--wheel", "--out-dir", str(wheels), str(EXAMPLES / name)])
    pins = tmp / "constraints.txt"
    export = [
        uv,
        "export",
        "--frozen",
        "--offline",
        "--quiet",
        "--no-dev",
        "--no-emit-workspace",
        "--no-hashes",
    ]
    _run([*export, "--all-packages", "--output-file", str(pins)])
    venv = tmp / "venv"
    _run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)])
    packages = [str(ROOT / "packages" / p) for p in PACKAGES]
    # --no-sources: the workspace's sources would install roll's packages as editable links to this checkout
    install = [
        uv,
        "pip",
        "install",
        "--quiet",
        "--offline",
        "--no-sources",
        "--python",
        str(venv / "bin" / "python"),
    ]
    _run([*install, "--constraints", str(pins), *packages, *sorted(map(str, wheels.glob("*.whl")))])
    linked = [p.name for p in venv.glob("lib/python*/site-packages/*.pth") if p.name.startswith("roll")]
    assert not linked, f"roll is installed as editable links, not copies: {linked}"
    return venv


def _train(venv: Path, name: str, tmp: Path) -> tuple[Path, list[dict[str, float]], str]:
    """``roll train examples/plugins/<name>/config.yaml`` in the fresh venv: the run dir, its metrics, the log."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    out_dir = tmp / name
    cmd = [str(venv / "bin" / "roll"), "train", str(EXAMPLES / name / "config.yaml"), f"output_dir={out_dir}"]
    log = _run(cmd, env=env, cwd=tmp, timeout=600)
    jsonl = out_dir / "metrics.jsonl"
    metrics = (
        [json.loads(line)["metrics"] for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
    )
    return out_dir, metrics, log


def _check_reward(venv: Path, tmp: Path) -> None:
    # every 12-token response keeps to the 24-word rule, so each row scores >= length_weight 0.5 (the arithmetic
    # reward on an untrained model gives 0)
    _, metrics, _ = _train(venv, "reward", tmp)
    assert len(metrics) == 1 and metrics[0]["reward/arithmetic/count"] == 16
    assert 0.5 <= metrics[0]["reward/arithmetic/mean"] <= 1.0 and metrics[0]["reward/errors"] == 0


def _check_env(venv: Path, tmp: Path) -> None:
    # 2 groups x 4 episodes of higher_lower, its metrics under its tag, no env errors
    _, metrics, _ = _train(venv, "env", tmp)
    assert metrics[0]["env/episodes_kept"] == 8 and "env/higher_lower/success_rate" in metrics[0]
    assert metrics[0]["env/errors"] == 0


def _check_tool(venv: Path, tmp: Path) -> None:
    # the run plays guess_direction with the lookup tool; then the same entry, built as the env workers build it,
    # answers a tool call through the plugin
    out_dir, metrics, _ = _train(venv, "tool", tmp)
    assert metrics[0]["env/episodes_kept"] == 8 and metrics[0]["env/errors"] == 0
    probe = (
        "import json; from roll.core.cli import load_run_config; from roll.agentic.env_manager.slots import build_env\n"
        f"_, cfg = load_run_config({str(out_dir / 'config.yaml')!r}, [], preflight=True)\n"
        "env = build_env(cfg.env_manager.envs[0]); env.reset(0)\n"
        'r = env.step(\'<tool_call>{"name": "lookup", "arguments": {"key": "South"}}</tool_call>\')\n'
        "print(json.dumps([r.observation, r.info, env.system_prompt]))"
    )
    answer = _run([str(venv / "bin" / "python"), "-c", probe]).splitlines()[-1]
    observation, info, prompt = json.loads(answer)
    assert observation == "<tool_response>\nDown\n</tool_response>" and info["tool_calls_ok"] == 1
    assert '"name": "lookup"' in prompt


def _check_tool_parser(venv: Path, tmp: Path) -> None:
    # no training step (the `tool` example trains this very run shape): the example config's env, built as the env
    # workers build it, shows the plugin's prompt, runs a pythonic call and answers a malformed one with its error
    probe = (
        "import json; from roll.core.cli import load_run_config; from roll.agentic.env_manager.slots import build_env\n"
        f"_, cfg = load_run_config({str(EXAMPLES / 'tool_parser' / 'config.yaml')!r}, [], preflight=True)\n"
        "env = build_env(cfg.env_manager.envs[0]); env.reset(0)\n"
        "ok = env.step('[calculator(expression=\"6*7\")]')\n"
        "env.reset(0); bad = env.step('[calculator(\"6*7\")]')\n"
        "print(json.dumps([ok.observation, ok.info, bad.observation, env.system_prompt]))"
    )
    answer = _run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp).splitlines()[-1]
    ok, info, bad, prompt = json.loads(answer)
    assert ok == "[calculator] 42" and info["tool_calls_ok"] == 1
    assert bad == "[tool] format error: each item must be a call with keyword arguments: name(key=value)"
    assert "reply with only a Python list of calls" in prompt


def _check_tracker(venv: Path, tmp: Path) -> None:
    # metrics.csv holds exactly the metrics roll's jsonl tracker wrote for the step
    out_dir, metrics, _ = _train(venv, "tracker", tmp)
    header, *rows = (out_dir / "metrics.csv").read_text().splitlines()
    assert header == "step,name,value" and len(metrics) == 1 and len(metrics[0]) >= 2
    assert {(int(s), n, float(v)) for s, n, v in (r.split(",") for r in rows)} == {
        (1, name, value) for name, value in metrics[0].items()
    }


def _check_strategy(venv: Path, tmp: Path) -> None:
    # the pipeline asked for 12 new tokens; hf_capped generated every response, so none is over 4
    _, metrics, _ = _train(venv, "strategy", tmp)
    assert metrics[0]["reward/arithmetic/count"] == 16 and 1 <= metrics[0]["response/length_max"] <= 4


def _check_pipeline(venv: Path, tmp: Path) -> None:
    # one kept answer per prompt, the best of its n scores
    out_dir, metrics, _ = _train(venv, "pipeline", tmp)
    kept = [json.loads(line) for line in (out_dir / "best_of_n.jsonl").read_text().splitlines()]
    assert len(kept) == 8 and all(len(r["scores"]) == 4 and r["score"] == max(r["scores"]) for r in kept)
    assert metrics[0]["best_of_n/prompts"] == 8
    assert metrics[0]["best_of_n/best_score"] >= metrics[0]["best_of_n/mean_score"]


CHECKS = {
    "reward": _check_reward,
    "env": _check_env,
    "tool": _check_tool,
    "tool_parser": _check_tool_parser,
    "tracker": _check_tracker,
    "strategy": _check_strategy,
    "pipeline": _check_pipeline,
}


@pytest.mark.slow
@pytest.mark.timeout(
    1200
)  # the first one also builds the venv; each run starts Ray and its actors (1-3 min loaded)
@pytest.mark.parametrize("name", list(PLUGINS))
def test_example_plugin_trains_in_a_fresh_venv(plugin_venv: Path, tmp_path: Path, name: str) -> None:
    listed = _run([str(plugin_venv / "bin" / "roll"), "list"], cwd=tmp_path)
    dist, group, plugin, _ = PLUGINS[name]
    assert any(line.split()[:2] == [plugin, dist] for line in listed.split(group + ":", 1)[1].splitlines()), (
        listed
    )
    CHECKS[name](plugin_venv, tmp_path)
