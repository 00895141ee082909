"""Plugins are found through real entry points of real installed distributions.

Fixture packages in tests/fixtures are installed (with uv, no deps) into scratch directories that the
subprocesses put on PYTHONPATH, exactly as `pip install roll-plugin-example` would make them visible.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _install(names: list[str], target: Path) -> Path:
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH; the test installs its fixture plugins with uv")
    for name in names:
        cmd = [uv, "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(FIXTURES / name)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return target


@pytest.fixture(scope="module")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _install(["roll-plugin-example"], tmp_path_factory.mktemp("site-example"))


@pytest.fixture(scope="module")
def clash_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _install(["roll-plugin-example", "roll-plugin-clash"], tmp_path_factory.mktemp("site-clash"))


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _install(["roll-plugin-broken"], tmp_path_factory.mktemp("site-broken"))


def _run(site: Path | None, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False
    )


def _py(site: Path | None, code: str) -> subprocess.CompletedProcess[str]:
    return _run(site, "-c", code)


def test_roll_list_shows_out_of_tree_pipeline(example_site: Path) -> None:
    out = _run(example_site, "-m", "roll.core.cli", "list")
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith("echo "))
    assert line.split()[:4] == ["echo", "roll-plugin-example", "0.3.0", "ok"]
    for group in (
        "roll.pipeline:",
        "roll.strategy:",
        "roll.reward:",
        "roll.env:",
        "roll.tool:",
        "roll.tool_parser:",
        "roll.tracker:",
    ):
        assert group in out.stdout


def test_roll_train_runs_out_of_tree_pipeline(example_site: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "echo.yaml"
    cfg.write_text(f"pipeline: echo\nmessage: hi\noutput_dir: {tmp_path / 'out'}\n")
    out = _run(example_site, "-m", "roll.core.cli", "train", str(cfg), "repeat=3")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "out" / "echo.txt").read_text() == "hi\nhi\nhi"
    assert "lines=3" in out.stdout


def test_unknown_pipeline_lists_installed(example_site: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("pipeline: ecko\n")
    out = _run(example_site, "-m", "roll.core.cli", "validate", str(cfg))
    assert out.returncode == 2
    assert "no pipeline plugin named 'ecko'" in out.stderr
    assert "did you mean 'echo'?" in out.stderr


def test_unknown_name_raises_listing_installed(example_site: Path) -> None:
    code = "from roll.core import plugins\ntry:\n plugins.load('roll.pipeline', 'nope')\nexcept LookupError as e:\n print(e)"
    out = _py(example_site, code)
    assert "no roll.pipeline plugin named 'nope'; installed:" in out.stdout
    assert "echo" in out.stdout


def test_duplicate_names_raise_naming_both_distributions(clash_site: Path) -> None:
    code = "from roll.core import plugins\ntry:\n plugins.available('roll.pipeline')\nexcept LookupError as e:\n print(e)"
    out = _py(clash_site, code)
    assert "plugin name 'echo' in group 'roll.pipeline' is defined twice" in out.stdout
    assert "roll-plugin-example 0.3.0" in out.stdout
    assert "roll-plugin-clash 0.1.0" in out.stdout


def _load_error(site: Path, name: str) -> str:
    code = (
        "from roll.core import plugins\ntry:\n"
        f" plugins.load('roll.pipeline', {name!r})\nexcept LookupError as e:\n print(e)"
    )
    return _py(site, code).stdout


def test_failed_import_names_the_extra(broken_site: Path) -> None:
    message = _load_error(broken_site, "needs_extra")
    assert "failed to import: No module named 'definitely_missing_backend'" in message
    assert "pip install 'roll-plugin-broken[fancy]'" in message


def test_object_checked_against_its_protocol(broken_site: Path) -> None:
    assert "is a dict, not a PipelineSpec" in _load_error(broken_site, "wrong_type")
    assert "calls itself 'something_else'" in _load_error(broken_site, "misnamed")


def test_roll_list_survives_broken_plugins(broken_site: Path) -> None:
    out = _run(broken_site, "-m", "roll.core.cli", "list")
    assert out.returncode == 0, out.stderr
    status = {ln.split()[0]: ln for ln in out.stdout.splitlines() if ln.startswith("  ")}
    assert "unavailable" in status["needs_extra"]


def test_unknown_group_raises() -> None:
    from roll.core import plugins
    from roll.core.errors import PluginError

    with pytest.raises(
        PluginError,
        match=r"unknown plugin group 'roll\.nope'; roll's groups are: roll\.agent, roll\.diffusion_reward, roll\.env",
    ):
        plugins.available("roll.nope")


def test_builtin_trackers_are_registered() -> None:
    from roll.core import plugins

    infos = plugins.available("roll.tracker")
    assert {"stdout", "jsonl", "tensorboard"} <= set(infos)
    assert json.dumps(infos["stdout"].dist) == '"roll-core"'
