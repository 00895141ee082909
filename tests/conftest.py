"""Fixtures every test package shares: the Ray fixture of ``roll.core.testing``, the HF-export check and the
in-process exact-resume check.

``resume_matches(run, workdir, steps=4, at=2)`` is the exact-resume check of the RL modes: ``run(overrides)``
trains a pipeline in this process (on the shared Ray); an uninterrupted run of ``steps`` steps checkpoints every
``at`` steps, a second run in a fresh output dir resumes from its step-``at`` checkpoint, and every logged metric
of every later step (time and throughput aside) must equal the uninterrupted run's, bitwise. The SIGKILL variant
(a real ``roll train`` killed with no clean exit) is ``kill_and_resume`` in ``tests/pipelines/conftest.py``.

``export_matches_trainer(output_dir)`` is the check every RL pipeline's end-to-end test runs with
``checkpoint.export_hf: true``: the exported folder loads with plain transformers (``AutoModelForCausalLM``,
``AutoTokenizer``) and gives the same logits as the trainer's own final weights, read from the run's last
checkpoint (``actor/model.safetensors``, what the trainer saved after its last step).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

pytest_plugins = ["roll.core.testing"]


@pytest.fixture(scope="session")
def export_matches_trainer() -> Callable[[Path], None]:
    return _export_matches_trainer


Metrics = dict[int, dict[str, float]]
Run = Callable[[list[str]], None]
TIMING_PREFIXES = ("time/", "throughput/")
"""Metrics that measure the machine, not the run: left out of exact-resume comparisons."""


def read_metrics(out: Path) -> Metrics:
    """``{step: metrics}`` of a run's ``metrics.jsonl``; a step logged twice keeps its last line."""
    import json

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["metrics"] for row in rows}


@pytest.fixture(scope="session")
def resume_matches() -> Callable[..., Metrics]:
    return _resume_matches


def _resume_matches(run: Run, workdir: Path, *, steps: int = 4, at: int = 2) -> Metrics:
    full, resumed = workdir / "full", workdir / "resumed"
    common = [f"max_steps={steps}", f"checkpoint.every_n_steps={at}", f"checkpoint.keep_last={steps}"]
    run([f"output_dir={full}", *common])
    checkpoint = full / "checkpoints" / f"step_{at:06d}"
    assert checkpoint.is_dir(), f"no checkpoint at step {at}"
    run([f"output_dir={resumed}", *common, f"resume={checkpoint}"])
    expected, got = read_metrics(full), read_metrics(resumed)
    assert min(got) == at + 1, f"the resumed run did not start after step {at}: {sorted(got)}"
    for step in range(at + 1, steps + 1):
        for name, value in expected[step].items():
            if not name.startswith(TIMING_PREFIXES):
                assert got[step][name] == value, (step, name, got[step][name], value)
    return expected


def _export_matches_trainer(output_dir: Path, prompt: str = "What is 3 + 4?") -> None:
    import torch
    from safetensors.torch import load_file
    from torch.testing import assert_close
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll.core.checkpoint import CheckpointManager

    exported = AutoModelForCausalLM.from_pretrained(output_dir / "hf").eval()
    tokenizer = AutoTokenizer.from_pretrained(output_dir / "hf")
    latest = CheckpointManager(output_dir / "checkpoints", keep_last=3).latest()
    assert latest is not None, "the run wrote no checkpoint"
    trainer_state = load_file(str(latest / "actor" / "model.safetensors"))
    trainer = AutoModelForCausalLM.from_config(exported.config).eval()
    missing, unexpected = trainer.load_state_dict(trainer_state, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    with torch.no_grad():
        assert_close(exported(ids).logits, trainer(ids).logits, rtol=0, atol=1e-5)
    changed = any(
        not torch.equal(v, exported.state_dict()[k])
        for k, v in trainer_state.items()
        if k in exported.state_dict()
    )
    assert not changed, "exported weights differ from the trainer's"
