"""``reward_fl``: reward-feedback fine-tuning of a text-to-image (or tiny video) diffusion model.

One role, ``actor_train``: data-parallel Ray actors that each hold the diffusion stack (denoiser trained, VAE and
text encoder frozen) and the reward, sample for their share of the step's prompts and train (FSDP2 on the
denoiser when there are several; gloo on CPU). Two algorithms, by ``algorithm.type``:

- ``draft``: the reward's gradient flows back through the last ``k`` denoising steps (DRaFT-K); ``k: 1`` with
  ``refl: true`` stops at a random one of the last ``refl_last`` steps and scores the one-step ``x0_hat`` (ReFL);
  ``k: null`` keeps every step, with gradient checkpointing (AlignProp). Optional ``kl_coef`` (noise-prediction
  distance to the frozen base, a per-step KL up to a constant) and ``pretrain_coef`` (the denoising loss on the
  kit's captioned shapes, against collapse).
- ``ddpo``: policy gradient for rewards without a gradient (JPEG compressibility): stochastic DDIM (``eta > 0``),
  per-step log-probs, per-prompt normalized advantages over ``batch.samples_per_prompt`` samples, PPO clipping.

Per eval step: a PNG grid of the fixed eval prompts, images in TensorBoard, ``reward_curve.png``. Export
(``checkpoint.export_hf``): a diffusers folder under ``<output_dir>/diffusers`` (full fine-tuning) or LoRA weights
under ``<output_dir>/lora`` that ``load_lora_weights`` reads.

This module holds the spec and re-exports the config (:mod:`.config`; no torch, no Ray); :mod:`.pipeline` has the
implementation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from roll.core.errors import ConfigError, ConfigIssue
from roll.core.types import Pipeline, PipelineSpec
from roll.diffusion.reward_fl.config import (
    DEFAULT_EVAL_PROMPTS,
    REWARD_GROUP,
    Algorithm,
    DDPOConfig,
    DenoiserModelConfig,
    DenoiserRoleConfig,
    DenoiserStrategyConfig,
    DiffusionLoraConfig,
    DraftConfig,
    EvalConfig,
    PromptsConfig,
    RewardConfig,
    RewardFLConfig,
    SamplingConfig,
)

__all__ = [
    "DEFAULT_EVAL_PROMPTS",
    "REWARD_GROUP",
    "SPEC",
    "Algorithm",
    "DDPOConfig",
    "DenoiserModelConfig",
    "DenoiserRoleConfig",
    "DenoiserStrategyConfig",
    "DiffusionLoraConfig",
    "DraftConfig",
    "EvalConfig",
    "PromptsConfig",
    "RewardConfig",
    "RewardFLConfig",
    "SamplingConfig",
]


def _preflight(config: Any) -> list[ConfigIssue]:
    """The start-up check the config model cannot make alone: the denoiser's folder exists when it is local."""
    from roll.diffusion.kit.paths import missing_diffusion_path

    problem = missing_diffusion_path(config.actor_train.model.path)
    return [] if problem is None else [ConfigIssue("actor_train.model.path", problem)]


def _build(config: Any) -> Pipeline:
    from roll.core.run import Run
    from roll.diffusion.reward_fl.pipeline import RewardFLRecipe

    return Run(config, name="reward_fl", recipe=lambda host: RewardFLRecipe(config, host))


def _export(config: Any, checkpoint: Path, out: Path, role: str | None) -> str:
    """``roll export``: the denoiser (the one trained model) as a diffusers folder or LoRA weights."""
    if role not in (None, "denoiser"):
        raise ConfigError(f"--role {role!r}: pipeline 'reward_fl' exports denoiser")
    from roll.diffusion.reward_fl.export import export_checkpoint

    return export_checkpoint(config, checkpoint, out)


SPEC = PipelineSpec(
    name="reward_fl",
    config_model=RewardFLConfig,
    build=_build,
    preflight=_preflight,
    description="reward feedback learning for diffusion models: DRaFT-K / ReFL / AlignProp, or DDPO",
    export=_export,
)
