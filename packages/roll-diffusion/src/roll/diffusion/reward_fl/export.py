"""``roll export`` for ``reward_fl``: a checkpoint's denoiser as a diffusers folder, or its LoRA weights.

A checkpoint holds the trainable parameters only (``actor_train/trainer.pt``: gathered whole from every FSDP2 shard
by :func:`~roll.diffusion.reward_fl.steps.full_state`, with the optimizer state), under the module's own names.
The export rebuilds the stack the run started from (``actor_train.model.path``, the adapter added as the trainer
adds it), lays the checkpoint's parameters over its denoiser's state and writes what the end-of-run export writes
(:func:`~roll.diffusion.reward_fl.steps.export`): full fine-tuning, the whole pipeline folder
(``DiffusionPipeline.from_pretrained(OUT)``); LoRA, ``pytorch_lora_weights.safetensors`` in diffusers' format,
which ``pipe.load_lora_weights(OUT)`` applies to the base pipeline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from roll.core.errors import CheckpointError
from roll.diffusion.reward_fl import steps as T
from roll.diffusion.reward_fl.pipeline import ACTOR_DIR
from roll.diffusion.reward_fl.worker import STATE_FILE


def export_checkpoint(config: Any, checkpoint: Path, out: Path) -> str:
    """Write the denoiser of ``checkpoint`` into ``out``; returns how to load it (``{out}``: the folder)."""
    from roll.diffusion.kit.paths import resolve_diffusion_path

    state_file = checkpoint / ACTOR_DIR / STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(f"no {ACTOR_DIR}/{STATE_FILE} in checkpoint {checkpoint}", path=str(checkpoint))
    trained: dict[str, torch.Tensor] = torch.load(state_file, map_location="cpu", weights_only=False)["model"]
    strategy = config.actor_train.strategy
    dtype = torch.bfloat16 if strategy.dtype == "bf16" else torch.float32
    stack = T.load_stack(config.actor_train.model.path, torch.device("cpu"), dtype)
    if strategy.lora is not None:
        T.add_lora(stack.denoiser, strategy.lora)
    full = stack.denoiser.state_dict()
    unknown = sorted(set(trained) - set(full))
    if unknown:
        raise CheckpointError(
            f"{state_file} holds parameters the model of the run config lacks: {unknown[:5]}",
            path=str(checkpoint),
        )
    full.update(trained)
    pipeline = type(stack.pipe).__name__
    if strategy.lora is not None:
        stack.save_lora(full, out)
        base = resolve_diffusion_path(config.actor_train.model.path)
        return (
            f"LoRA weights (diffusers format): pipe = diffusers.{pipeline}.from_pretrained({base!r}); "
            "pipe.load_lora_weights({out})"
        )
    stack.save_full(full, out)
    return f"diffusers folder: load with diffusers.{pipeline}.from_pretrained({{out}})"
