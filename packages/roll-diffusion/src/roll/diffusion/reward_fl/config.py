"""Config of the ``reward_fl`` pipeline (light: pydantic only; see :mod:`roll.diffusion.reward_fl` for the method).

A module of its own so that the implementation (:mod:`.pipeline`, :mod:`.worker`, :mod:`.steps`, :mod:`.export`)
imports the config without importing the package's spec, which imports those modules in its hooks.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import Field, ValidationError, model_validator

from roll.core import plugins
from roll.core.config.base import RollModel
from roll.core.config.batch import BatchConfig
from roll.core.config.sections import RoleConfig, RunConfig
from roll.core.config.validate import issues_error
from roll.core.errors import ConfigIssue, PluginError
from roll.workers.config import OptimizerConfig

REWARD_GROUP = "roll.diffusion_reward"
DEFAULT_EVAL_PROMPTS = [
    "a red circle on blue",
    "a green square on yellow",
    "a blue triangle on red",
    "a yellow circle on green",
    "a red square on green",
    "a green triangle on blue",
    "a blue circle on yellow",
    "a yellow triangle on red",
]


class DenoiserModelConfig(RollModel):
    """A diffusers folder: a kit preset (``tiny-sd``, ``tiny-wan``), a local path or a hub id."""

    path: str = Field(
        "tiny-sd", description="a kit preset (tiny-sd, tiny-wan), a local diffusers folder or hub id"
    )


class DiffusionLoraConfig(RollModel):
    """LoRA adapters on the denoiser's attention projections (peft); the base weights stay frozen."""

    r: int = Field(4, ge=1, description="rank of the adapter matrices")
    alpha: int = Field(4, ge=1, description="LoRA scaling numerator: updates are scaled by alpha / r")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter's input")
    target_modules: list[str] = Field(
        default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0"],
        description="names of the denoiser's attention projections that get an adapter",
    )


class DenoiserStrategyConfig(RollModel):
    """How the denoiser trains: FSDP2 over the role's workers (a plain module on one), full or LoRA."""

    type: Literal["fsdp2"] = Field("fsdp2", description="the only denoiser strategy")
    device: str = Field("auto", description="'auto' = cuda when available, else cpu")
    dtype: Literal["fp32", "bf16"] = Field("fp32", description="dtype of the diffusion stack")
    optimizer: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(lr=1e-4))
    max_grad_norm: float | None = Field(1.0, gt=0, description="gradient clipping norm; None disables it")
    lora: DiffusionLoraConfig | None = Field(
        None, description="train a LoRA adapter instead of the whole denoiser"
    )


class DenoiserRoleConfig(RoleConfig):
    """The trained denoiser's role: placement, the diffusers model and how it trains."""

    model: DenoiserModelConfig = Field(default_factory=DenoiserModelConfig)
    strategy: DenoiserStrategyConfig = Field(default_factory=DenoiserStrategyConfig)


class SamplingConfig(RollModel):
    """The sampler: DDIM with ``num_steps`` steps (flow-matching Euler for Wan), classifier-free guidance."""

    num_steps: int = Field(10, ge=1, description="DDIM denoising steps per image")
    guidance_scale: float = Field(1.0, ge=1.0, description="1 disables classifier-free guidance")
    eta: float = Field(0.0, ge=0.0, le=1.0, description="DDIM noise; ddpo needs > 0")


class DraftConfig(RollModel):
    type: Literal["draft"] = Field("draft", description="DRaFT-K / ReFL / AlignProp: the reward's gradient")
    k: int | None = Field(1, ge=1, description="steps the gradient flows through; null = all (AlignProp)")
    refl: bool = Field(False, description="stop at a random late step and score x0_hat (ReFL; needs k: 1)")
    refl_last: int = Field(3, ge=1, description="ReFL draws its stop step among the last refl_last steps")
    gradient_checkpointing: bool = Field(True, description="recompute the grad steps' activations")
    kl_coef: float = Field(
        0.0, ge=0.0, description="weight of the noise-prediction distance to the frozen base"
    )
    pretrain_coef: float = Field(0.0, ge=0.0, description="denoising loss on the kit's shapes, mixed in")


class DDPOConfig(RollModel):
    type: Literal["ddpo"] = Field("ddpo", description="DDPO: policy gradient for rewards without a gradient")
    clip_range: float = Field(1e-4, gt=0, description="PPO clip range of the per-step likelihood ratio")
    adv_clip: float = Field(
        5.0, gt=0, description="per-prompt normalized advantages are clamped into [-x, x]"
    )
    timestep_fraction: float = Field(1.0, gt=0, le=1.0, description="share of the steps trained on")


Algorithm = Annotated[DraftConfig | DDPOConfig, Field(discriminator="type")]


class RewardConfig(RollModel):
    """A ``roll.diffusion_reward`` plugin by name and its options (validated against its config model)."""

    name: str = Field("shape_alignment", description="a roll.diffusion_reward entry point (see rewards)")
    options: dict[str, Any] = Field(default_factory=dict, description="the reward plugin's own keys")

    @model_validator(mode="after")
    def _known(self) -> Self:
        try:
            spec = plugins.load(REWARD_GROUP, self.name)
        except PluginError as exc:
            raise issues_error([ConfigIssue("name", str(exc))]) from None
        if spec.config_model is not None:
            try:
                spec.config_model(**self.options)
            except ValidationError as exc:
                issues = [
                    ConfigIssue(".".join(["options", *map(str, e["loc"])]), e["msg"]) for e in exc.errors()
                ]
                raise issues_error(issues) from None
        return self


class PromptsConfig(RollModel):
    """Training prompts (``builtin:shapes``: the kit's 36 captions) and the fixed eval prompts."""

    train: list[str] | Literal["builtin:shapes"] = Field(
        "builtin:shapes", description="training prompts, or builtin:shapes for the kit's 36 captions"
    )
    eval: list[str] = Field(
        default_factory=lambda: list(DEFAULT_EVAL_PROMPTS),
        min_length=1,
        description="fixed prompts of every eval",
    )


class EvalConfig(RollModel):
    """What each evaluation samples: the eval prompts from fixed noise, drawn as a PNG grid."""

    seed: int = Field(1234, description="seed of the eval noise, the same at every evaluation")
    grid_columns: int = Field(8, ge=1, description="images per row of the eval grid PNG")


class RewardFLConfig(RunConfig):
    """Config of the ``reward_fl`` pipeline."""

    pipeline: str = "reward_fl"
    actor_train: DenoiserRoleConfig = Field(
        default_factory=DenoiserRoleConfig, description="the trained denoiser: placement, model and strategy"
    )
    reward: RewardConfig = Field(default_factory=RewardConfig)
    algorithm: Algorithm = Field(
        default_factory=DraftConfig, description="draft (reward gradient) or ddpo (policy gradient), by type"
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    prompts: PromptsConfig = Field(default_factory=PromptsConfig)
    batch: BatchConfig = Field(default_factory=lambda: BatchConfig(prompts_per_step=8, micro_batch_samples=8))
    eval: EvalConfig = Field(
        default_factory=EvalConfig, description="eval grid settings (every eval_every steps)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        issues = self.batch.check(self.actor_train.num_workers, where="actor_train.num_workers")
        issues += _algorithm_issues(self)
        if issues:
            raise issues_error(issues)
        return self


def _algorithm_issues(cfg: RewardFLConfig) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    algo = cfg.algorithm
    if cfg.batch.micro_batch_samples is None:
        issues.append(
            ConfigIssue("batch.micro_batch_tokens", "images have no tokens", "set batch.micro_batch_samples")
        )
    if cfg.batch.prompts_per_step % cfg.actor_train.num_workers:
        issues.append(
            ConfigIssue(
                "batch.prompts_per_step",
                f"{cfg.batch.prompts_per_step} prompts do not split over {cfg.actor_train.num_workers} workers "
                "(each worker samples whole prompt groups)",
                "use a multiple of actor_train.num_workers",
            )
        )
    if isinstance(algo, DraftConfig):
        if algo.k is not None and algo.k > cfg.sampling.num_steps:
            issues.append(
                ConfigIssue("algorithm.k", f"k={algo.k} > sampling.num_steps={cfg.sampling.num_steps}")
            )
        if algo.refl and algo.k != 1:
            issues.append(
                ConfigIssue("algorithm.refl", "ReFL backpropagates through one step", "set algorithm.k: 1")
            )
        if algo.refl and algo.refl_last > cfg.sampling.num_steps:
            issues.append(ConfigIssue("algorithm.refl_last", "more than sampling.num_steps"))
    else:
        if cfg.sampling.eta <= 0.0:
            issues.append(
                ConfigIssue("sampling.eta", "ddpo needs a stochastic sampler", "set sampling.eta: 1.0")
            )
        if cfg.batch.samples_per_prompt < 2:
            issues.append(
                ConfigIssue(
                    "batch.samples_per_prompt", "per-prompt advantages need >= 2 samples", "set it to 4"
                )
            )
    return issues
