"""LoRA fine-tuning in the trainer (in this process, no Ray): one DRaFT step changes only adapter weights, and
the exported ``pytorch_lora_weights.safetensors`` loaded into the base pipeline with ``load_lora_weights``
draws the trainer's evaluation images for the same seed."""

from __future__ import annotations

from pathlib import Path

import torch

from roll.core.cluster import WorkerContext
from roll.core.config.loader import load_config
from roll.diffusion.reward_fl import RewardFLConfig
from roll.diffusion.reward_fl.worker import DenoiserTrainer

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["a red circle on blue", "a green square on yellow"]


def test_lora_step_trains_adapters_only_and_exports_loadable_weights(tiny_sd: Path, tmp_path: Path) -> None:
    from diffusers import StableDiffusionPipeline

    overrides = [
        "sampling.num_steps=4",
        "actor_train.strategy.lora={r: 4, alpha: 4}",
        "actor_train.strategy.optimizer.lr=1e-2",
        "batch.prompts_per_step=2",
        "batch.micro_batch_samples=2",
    ]
    cfg = load_config(ROOT / "examples" / "reward_fl.yaml", overrides, model=RewardFLConfig)
    tr = DenoiserTrainer(WorkerContext("actor_train", 0, 1), cfg)
    tr.setup()
    before = {n: p.detach().clone() for n, p in tr.denoiser.named_parameters()}
    tr.train_step(PROMPTS, 0)
    changed = {n for n, p in tr.denoiser.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora" in n for n in changed), sorted(changed)[:5]

    target = Path(tr.export(str(tmp_path)))
    assert (target / "pytorch_lora_weights.safetensors").is_file()
    ours = tr.evaluate(PROMPTS, 77)["images"]
    pipe = StableDiffusionPipeline.from_pretrained(
        tiny_sd, safety_checker=None, requires_safety_checker=False
    )
    plain = pipe(
        PROMPTS,
        generator=torch.Generator().manual_seed(77),
        num_inference_steps=4,
        guidance_scale=1.0,
        output_type="pt",
    )
    pipe.load_lora_weights(target)
    out = pipe(
        PROMPTS,
        generator=torch.Generator().manual_seed(77),
        num_inference_steps=4,
        guidance_scale=1.0,
        output_type="pt",
    )
    got = (out.images * 255).round().to(torch.uint8)
    assert (got.int() - ours.int()).abs().max() <= 1
    assert not torch.equal(plain.images, out.images)  # the adapters did change the pipeline's output
