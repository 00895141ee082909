"""Fixtures every test package shares: those of ``roll.core.testing`` (the Ray fixture, ``kill_and_resume``,
``resume_matches``) and the HF-export check.

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
