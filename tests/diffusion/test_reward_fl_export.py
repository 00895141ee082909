"""``roll export`` of a ``reward_fl`` checkpoint: one training step on the tiny kit (full fine-tuning, and LoRA),
``roll export RUN OUT``, then in a fresh process that imports no roll module, plain diffusers: the exported
pipeline folder (full), or the base pipeline plus ``load_lora_weights(OUT)`` (LoRA). The UNet's noise prediction
on fixed seeded latents, timestep and text embeddings must equal the trainer's, whose weights are restored from
the same checkpoint by the trainer's own ``load_checkpoint`` to 1e-5."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core.cli import main

ROOT = Path(__file__).resolve().parents[2]
YAML = ROOT / "examples" / "reward_fl.yaml"
SHORT = [
    "max_steps=1",
    "eval_every=0",
    "sampling.num_steps=2",
    "batch.prompts_per_step=2",
    "batch.micro_batch_samples=2",
    "actor_train.strategy.optimizer.lr=1e-2",
    "checkpoint.export_hf=false",
    "tracking.progress=false",
    "tracking.backends=[jsonl]",
    "ray.address=auto",
]

_PLAIN = textwrap.dedent(
    """
    import sys
    import diffusers, torch
    folder, lora, dst = sys.argv[1:]
    base = folder if lora == "-" else lora
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(base, safety_checker=None, requires_safety_checker=False)
    if lora != "-":
        pipe.load_lora_weights(folder)
    unet = pipe.unet.eval()
    gen = torch.Generator().manual_seed(0)
    size, dim = unet.config.sample_size, unet.config.cross_attention_dim
    latents = torch.randn(1, unet.config.in_channels, size, size, generator=gen)
    emb = torch.randn(1, 8, dim, generator=gen)
    with torch.no_grad():
        eps = unet(latents, 5, encoder_hidden_states=emb).sample
    roll = sorted(m for m in sys.modules if m == "roll" or m.startswith("roll."))
    torch.save({"eps": eps, "roll": roll}, dst)
    """
)


def _trainer_eps(run: Path) -> torch.Tensor:
    """The trainer's denoiser, restored from the run's checkpoint by the trainer itself, on the same inputs."""
    from roll.core.checkpoint import CheckpointManager
    from roll.core.cli import load_run_config
    from roll.core.cluster import WorkerContext
    from roll.diffusion.reward_fl.worker import DenoiserTrainer

    latest = CheckpointManager(run / "checkpoints", keep_last=3).latest()
    assert latest is not None
    _, cfg = load_run_config(latest / "run_config.yaml", [])
    trainer = DenoiserTrainer(WorkerContext("actor_train", 0, 1), cfg)
    trainer.setup()
    before = {n: p.detach().clone() for n, p in trainer.denoiser.named_parameters()}
    trainer.load_checkpoint(str(latest / "actor_train"))
    changed = [n for n, p in trainer.denoiser.named_parameters() if not torch.equal(p, before[n])]
    assert changed, "the checkpoint holds the untrained denoiser"
    unet = trainer.denoiser.eval()
    gen = torch.Generator().manual_seed(0)
    size, dim = unet.config.sample_size, unet.config.cross_attention_dim
    latents = torch.randn(1, unet.config.in_channels, size, size, generator=gen)
    emb = torch.randn(1, 8, dim, generator=gen)
    with torch.no_grad():
        eps: torch.Tensor = unet(latents, 5, encoder_hidden_states=emb).sample
    return eps


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_reward_fl_export_reloads_in_plain_diffusers(
    lora: bool, ray_local: Any, tiny_sd: Path, run_reward_fl: Any, tmp_path: Path, capsys: Any
) -> None:
    extra = ["+actor_train.strategy.lora={r: 4, alpha: 4}"] if lora else []
    run = run_reward_fl(YAML, tmp_path / "run", [*SHORT, *extra])
    out = tmp_path / "export"
    assert main(["export", str(run), str(out)]) == 0
    printed = capsys.readouterr().out
    if lora:
        assert {p.name for p in out.iterdir()} == {"pytorch_lora_weights.safetensors"}
        assert f"pipe.load_lora_weights({str(out)!r})" in printed, printed
    else:
        assert (out / "model_index.json").is_file() and (out / "unet").is_dir()
        assert f"StableDiffusionPipeline.from_pretrained({str(out)!r})" in printed, printed

    dst = tmp_path / "plain.pt"
    base = str(tiny_sd) if lora else "-"
    subprocess.run([sys.executable, "-c", _PLAIN, str(out), base, str(dst)], check=True, timeout=300)
    plain = torch.load(dst, weights_only=False)
    assert plain["roll"] == [], f"loading the export imported roll: {plain['roll']}"
    torch.testing.assert_close(plain["eps"], _trainer_eps(run), rtol=0, atol=1e-5)
