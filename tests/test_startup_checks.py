"""``roll validate`` runs every check ``roll train`` runs before Ray starts, and both report a problem with its key
path and the same message (:mod:`roll.core.startup`: one list of checks, run by both).

Each case is a config with problems train used to meet only after Ray started (or never): ``roll validate`` must
exit 2 naming every key path at once, and ``roll train`` of the same config must exit 2 with the same problem lines,
without starting Ray (no "Started a local Ray instance", well under the ~10 s a Ray start costs plus actor start-up).

Runs in the full suite only (it needs the training modes' packages), like tests/test_examples.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RAY_STARTED = "Started a local Ray instance"


def _roll(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    cmd = [sys.executable, "-m", "roll.core.cli", *args]
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    return out, time.monotonic() - start


def _problems(stderr: str) -> list[str]:
    """The report's lines from ``roll: N problem(s) in config`` on (progress bars of ``datasets`` come before)."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("roll: ") and "in config" in line)
    return lines[start:]


def _validate_and_train_agree(tmp_path: Path, config: str, *overrides: str) -> str:
    """Both commands exit 2 with the same report, train before Ray; returns the report."""
    checked, _ = _roll("validate", config, *overrides, cwd=tmp_path)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert "Traceback" not in checked.stderr
    trained, seconds = _roll("train", config, *overrides, cwd=tmp_path)
    output = trained.stdout + trained.stderr
    assert trained.returncode == 2, output
    assert RAY_STARTED not in output and "Traceback" not in output
    assert not (tmp_path / "out").exists(), (
        "train built the pipeline (claimed output_dir=out) before rejecting"
    )
    assert seconds < 120, f"train took {seconds:.0f}s to reject the config: did it start Ray?"
    report = _problems(checked.stderr)
    assert _problems(trained.stderr) == report
    return "\n".join(report)


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_model_path_column_typo_node_pin_tracker_and_sources_all_at_once(tmp_path: Path) -> None:
    """(a) a model path that does not exist, (c) a DPO column typo, (d) a node label no machine offers (the run
    starts a local Ray, whose node offers only node:<ip>), a tracker that is not installed, a missing eval file and a
    builtin task option that does not exist: six problems, one report, from validate and train alike (every case runs with output_dir=out)."""
    pairs = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": "2+2=", "good": "4", "bad": "5"}] * 4)
    report = _validate_and_train_agree(
        tmp_path,
        str(ROOT / "examples/dpo.yaml"),
        "actor_train.model.path=/nope/model",
        f"data.sources=[{{path: {pairs}, fields: {{chosen: good, rejected: badd}}}}]",
        "data.eval_sources=[{path: missing.jsonl}, "
        "{path: 'builtin:arithmetic', builtin_kind: preference, max_samples: 4, builtin_options: {levle: 3}}]",
        "actor_train.node=trainer",
        "tracking.backends=[stdout,nope]",
        "output_dir=out",
    )
    assert "roll: 6 problems in config:" in report
    assert "actor_train.model.path (<override 1: " in report and "'/nope/model' does not exist" in report
    assert (
        "data.sources.0.path (" in report
        and "fields.rejected: 'badd' names a column that does not exist" in report
    )
    assert "data.eval_sources.0.path (" in report and "missing.jsonl" in report
    assert "data.eval_sources.1.path (" in report and "bad options {'levle': 3}" in report
    assert "actor_train.node (" in report and "no machine offers 'trainer'" in report
    assert "tracking.backends.1 (" in report and "no roll.tracker plugin named 'nope'" in report


def test_unknown_template(tmp_path: Path) -> None:
    """(b) an unknown ``tokenize.template``: train used to fail 12 s in, after Ray started, without a key path."""
    report = _validate_and_train_agree(
        tmp_path, str(ROOT / "examples/sft.yaml"), "tokenize.template=chatmll", "output_dir=out"
    )
    assert (
        "tokenize.template (<override 1: tokenize.template=chatmll>): unknown chat template 'chatmll'"
        in report
    )
    assert "known: chatml, plain, qwen" in report


def test_sft_generate_on_user_data(tmp_path: Path) -> None:
    """(e) SFT's ``eval.generate: true`` on data no verifier can score: it used to be silently ignored (no
    answer accuracy ever appeared); now it is rejected at ``eval.generate``."""
    rows = _jsonl(tmp_path / "sft.jsonl", [{"q": "2+2=", "a": "4"}] * 4)
    report = _validate_and_train_agree(
        tmp_path,
        str(ROOT / "examples/sft.yaml"),
        f"data.sources=[{{path: {rows}, fields: {{prompt: q, response: a}}}}]",
        "data.eval_sources=[]",
        "+eval.generate=true",
        "output_dir=out",
    )
    assert "roll: 1 problem in config:" in report
    assert "eval.generate (<override 3: +eval.generate=true>)" in report
    assert "held-out source data.sources.0 is" in report and "sft.jsonl" in report


def test_sft_on_user_data_without_generate_validates(tmp_path: Path) -> None:
    """The same user data with ``eval.generate`` unset is fine: answers are scored only on builtin tasks."""
    rows = _jsonl(tmp_path / "sft.jsonl", [{"q": "2+2=", "a": "4"}] * 4)
    out, _ = _roll(
        "validate",
        str(ROOT / "examples/sft.yaml"),
        f"data.sources=[{{path: {rows}, fields: {{prompt: q, response: a}}}}]",
        "data.eval_sources=[]",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr


def test_images_for_a_text_model_missing_image_and_reward_options(tmp_path: Path) -> None:
    """RLVR rows with images for a text model (tiny-1m), an image file that does not exist, and a reward option
    its plugin does not take."""
    rows = [{"prompt": "what colour?", "images": [str(tmp_path / "nope.png")], "ground_truth": "red"}] * 2
    data = _jsonl(tmp_path / "vl.jsonl", rows)
    report = _validate_and_train_agree(
        tmp_path,
        str(ROOT / "examples/quickstart.yaml"),
        f"data.sources=[{{path: {data}}}]",
        "data.eval_sources=[]",
        "+rewards.arithmetic.options={bogus: 1}",
        "output_dir=out",
    )
    assert "rewards.arithmetic.options" in report and "bogus" in report
    assert "data.sources.0.path (" in report
    assert (
        "rows carry images or videos, but actor_train.model.path 'tiny-1m' is not a vision-language model"
        in report
    )
    assert "nope.png' does not exist" in report


def test_a_tokenizer_without_chat_template_for_chat_data(tmp_path: Path) -> None:
    """A local model folder whose tokenizer has no chat template (only its small files are read: there are no
    weights here at all) while ``tokenize.template`` is unset: rejected at ``tokenize.template``."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}), encoding="utf-8")
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}), encoding="utf-8")
    report = _validate_and_train_agree(
        tmp_path, str(ROOT / "examples/sft.yaml"), f"actor_train.model.path={model}", "output_dir=out"
    )
    assert "tokenize.template (" in report and "has no chat template" in report
    assert f"actor_train.model.path ('{model}')" in report


def test_env_options_of_an_agentic_run(tmp_path: Path) -> None:
    """An env option the env's config does not have (agentic pre-flight), named by its key path."""
    report = _validate_and_train_agree(
        tmp_path,
        str(ROOT / "examples/agentic_guess.yaml"),
        "env_manager.envs=[{type: guess_direction, options: {num_directions: 2, bogus: 1}}]",
        "output_dir=out",
    )
    assert "env_manager.envs.0.options" in report and "bogus" in report


@pytest.mark.parametrize("node", ["node:127.0.0.1"])
def test_a_pin_to_this_machine_passes(tmp_path: Path, node: str) -> None:
    """The local Ray's node offers node:<this machine's IP>: a pin to it is no problem."""
    out, _ = _roll("validate", str(ROOT / "examples/sft.yaml"), f"actor_train.node={node}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr


def test_a_missing_diffusers_folder(tmp_path: Path) -> None:
    """reward_fl's denoiser folder (a diffusers folder, not a transformers one) that does not exist."""
    report = _validate_and_train_agree(
        tmp_path,
        str(ROOT / "examples/reward_fl.yaml"),
        "actor_train.model.path=./no-such-unet",
        "output_dir=out",
    )
    assert "actor_train.model.path (<override 1: " in report and "'./no-such-unet' does not exist" in report
