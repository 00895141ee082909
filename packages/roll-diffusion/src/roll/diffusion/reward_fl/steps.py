"""The pieces of a ``DenoiserTrainer`` step, as functions of the trainer (so the worker class stays short):
stack loading, seeding, sampling, the DRaFT and DDPO losses of one micro-batch, full state dicts and export.

They read the trainer through :class:`TrainerState`, the six attributes they use, so this module does not import
the worker that calls it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from roll.core.errors import ConfigError, RollError
from roll.diffusion import losses as L
from roll.diffusion import sampling as S
from roll.diffusion.reward_fl.config import DDPOConfig, DraftConfig, RewardFLConfig

LORA_DIR = "lora"
DIFFUSERS_DIR = "diffusers"


class TrainerState(Protocol):
    """What the step functions read of a :class:`~roll.diffusion.reward_fl.worker.DenoiserTrainer`: the run config,
    the diffusion stack, the trained denoiser, the frozen base for the KL term (``None`` without one), the reward
    and the trainer's data-parallel rank."""

    cfg: RewardFLConfig
    stack: Any
    denoiser: Any
    base: Any
    reward: Any

    @property
    def rank(self) -> int: ...


class DiffusionConfigError(ConfigError):
    """A config that loads but does not fit the model or reward it names (found when the trainer starts)."""

    def __init__(self, message: str) -> None:
        RollError.__init__(self, message)
        self.issues = []
        self._kwargs = {"message": message}


def add_lora(model: Any, lora: Any) -> None:
    """Freeze ``model`` and add the run's peft LoRA adapter (``actor_train.strategy.lora``) to it, as training and
    ``roll export`` both build it."""
    from peft import LoraConfig

    model.requires_grad_(False)
    model.add_adapter(
        LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            init_lora_weights="gaussian",
        )
    )


def load_stack(path: str, device: torch.device, dtype: torch.dtype) -> Any:
    """An :class:`~roll.diffusion.stack.ImageStack`, or a :class:`~roll.diffusion.video.VideoStack` for Wan."""
    from roll.diffusion.kit.paths import resolve_diffusion_path

    folder = resolve_diffusion_path(path)
    if _is_wan(folder):
        from roll.diffusion.video import VideoStack

        return VideoStack(folder, device, dtype)
    from roll.diffusion.stack import ImageStack

    return ImageStack(folder, device, dtype)


def _is_wan(folder: str) -> bool:
    index = Path(folder) / "model_index.json"
    return index.is_file() and "Wan" in index.read_text(encoding="utf-8").split("_class_name")[1][:40]


def seed_for(*parts: int) -> int:
    """A 63-bit seed from integers, stable across processes and Python versions."""
    digest = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def rank_share(items: list[str], rank: int, world: int) -> list[str]:
    n = len(items) // world
    return items[rank * n : (rank + 1) * n]


def sample_generators(run_seed: int, step: int, first: int, count: int) -> list[torch.Generator]:
    """One generator per sample, seeded by (run seed, step, the sample's index among the step's prompts).

    Every draw a sample makes (its initial latents, its stochastic-step noise, its pretraining noise) comes from its
    own generator, so a sample gets the same noise however the step's prompts are split over ranks and
    micro-batches: two data-parallel ranks train exactly as one rank on the whole batch."""
    return [torch.Generator().manual_seed(seed_for(run_seed, step, first + i)) for i in range(count)]


def shard(model: Any) -> None:
    """FSDP2: each down/up block, then the root, ``fully_shard``-ed over all ranks (gloo on CPU, NCCL on GPU)."""
    from torch.distributed.fsdp import fully_shard

    for name in ("down_blocks", "up_blocks", "blocks"):
        for block in getattr(model, name, []):
            fully_shard(block)
    fully_shard(model)


# ------------------------------------------------------------------------------------------------ sampling


def sample_images(
    tr: TrainerState, prompts: list[str], generator: torch.Generator | list[torch.Generator], *, eta: float
) -> torch.Tensor:
    """Images (or videos) in [0, 1] sampled without gradients."""
    stack, cfg = tr.stack, tr.cfg.sampling
    emb = stack.text_embeddings(prompts, cfg.guidance_scale)
    latents = stack.initial_latents(len(prompts), generator)
    eps = stack.eps_fn(tr.denoiser, cfg.guidance_scale)
    traj = stack.sample(eps, emb, latents, stack.steps(cfg.num_steps), eta=eta, generator=generator)
    return stack.decode(traj.latents)


def frames_as_images(images: torch.Tensor) -> torch.Tensor:
    """``[B, 3, H, W]`` as is; a video ``[B, F, 3, H, W]`` as ``[B*F, 3, H, W]`` (rewards score frames)."""
    return images.flatten(0, 1) if images.dim() == 5 else images


def frame_prompts(prompts: list[str], images: torch.Tensor) -> list[str]:
    frames = images.shape[1] if images.dim() == 5 else 1
    return [p for p in prompts for _ in range(frames)]


def per_sample(rewards: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """Frame rewards averaged per video; image rewards unchanged, ``[B]``."""
    batch = images.shape[0]
    return rewards.view(batch, -1).mean(dim=1)


def grad_window(tr: TrainerState, algo: DraftConfig, step: int) -> tuple[int, int | None]:
    """``(grad_from, stop_at)``: DRaFT-K keeps the last K steps; ReFL stops at a random late step, the same on
    every rank and micro-batch of a training step."""
    n = tr.cfg.sampling.num_steps
    if algo.refl:
        stop = int(np.random.default_rng(seed_for(tr.cfg.seed, step)).integers(n - algo.refl_last, n))
        return stop, stop
    k = n if algo.k is None else algo.k
    return n - k, None


def draft_micro_loss(
    tr: TrainerState, prompts: list[str], step: int, first: int, algo: DraftConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch of DRaFT/ReFL/AlignProp: sample with gradients through the window, score, regularize.
    ``first`` is the micro-batch's first index among the step's prompts (its samples' noise seeds)."""
    stack, cfg = tr.stack, tr.cfg.sampling
    generator = sample_generators(tr.cfg.seed, step, first, len(prompts))
    emb = stack.text_embeddings(prompts, cfg.guidance_scale)
    latents = stack.initial_latents(len(prompts), generator)
    grad_from, stop_at = grad_window(tr, algo, step)
    eps = stack.eps_fn(tr.denoiser, cfg.guidance_scale)
    traj = stack.sample(
        eps,
        emb,
        latents,
        stack.steps(cfg.num_steps),
        grad_from=grad_from,
        stop_at=stop_at,
        eta=cfg.eta,
        generator=generator,
        checkpointed=algo.gradient_checkpointing,
    )
    images = stack.decode(traj.latents)
    rewards_B = per_sample(tr.reward(frames_as_images(images), frame_prompts(prompts, images)), images)
    loss = L.draft_loss(rewards_B)
    metrics = {"reward_mean": float(rewards_B.detach().mean()), "reward_loss": float(loss.detach())}
    if algo.kl_coef > 0:
        kl = kl_term(tr, traj, emb)
        loss = loss + algo.kl_coef * kl
        metrics["kl"] = float(kl.detach())
    if algo.pretrain_coef > 0:
        pre = pretrain_loss(tr, prompts, step, first)
        loss = loss + algo.pretrain_coef * pre
        metrics["pretrain_loss"] = float(pre.detach())
    return loss, metrics


def kl_term(tr: TrainerState, traj: Any, emb: torch.Tensor) -> torch.Tensor:
    """Mean over the grad steps of :func:`~roll.diffusion.losses.eps_regularizer` against the frozen base."""
    base_eps = tr.stack.eps_fn(
        tr.base if tr.base is not None else tr.denoiser, tr.cfg.sampling.guidance_scale
    )
    terms = []
    for x, t, e in zip(traj.grad_inputs, traj.grad_timesteps, traj.eps):
        with torch.no_grad(), _adapters_off(tr):
            e_base = base_eps(x.detach(), t, emb)
        terms.append(L.eps_regularizer(e, e_base))
    return torch.stack(terms).mean()


class _adapters_off:
    """Context: LoRA adapters disabled (the frozen base), when the trainer has no separate base copy."""

    def __init__(self, tr: TrainerState) -> None:
        self.model = tr.denoiser if tr.base is None else None

    def __enter__(self) -> None:
        if self.model is not None:
            self.model.disable_adapters()

    def __exit__(self, *exc: object) -> None:
        if self.model is not None:
            self.model.enable_adapters()


def pretrain_loss(tr: TrainerState, prompts: list[str], step: int, first: int) -> torch.Tensor:
    """The denoising loss on kit shapes rendered for ``prompts`` (kit captions only); each sample's picture,
    noise and timestep seeded by its index among the step's prompts."""
    from roll.diffusion.kit import shapes

    stack = tr.stack
    seeds = [seed_for(tr.cfg.seed, step, first + i, 1) for i in range(len(prompts))]
    size = stack.image_size
    pixels = np.stack([shapes.render(p, seed=sd, size=size) for p, sd in zip(prompts, seeds)])
    x = torch.from_numpy(pixels).float().permute(0, 3, 1, 2).div(127.5).sub(1.0).to(stack.device)
    with torch.no_grad():
        x0 = stack.vae.encode(x).latent_dist.mean * stack.vae.config.scaling_factor
    gens = [torch.Generator().manual_seed(sd) for sd in seeds]
    noise = torch.cat([torch.randn((1, *x0.shape[1:]), generator=g) for g in gens]).to(x0.device)
    steps_T = stack.scheduler.config.num_train_timesteps
    t = torch.cat([torch.randint(0, steps_T, (1,), generator=g) for g in gens]).to(x0.device)
    noisy = stack.scheduler.add_noise(x0, noise, t)
    out = tr.denoiser(noisy, t, encoder_hidden_states=stack.encode(prompts)).sample
    return torch.nn.functional.mse_loss(out, noise)


# ------------------------------------------------------------------------------------------------ DDPO


@dataclass
class Rollouts:
    """Stochastic samples of one step: per-step states and log-probs, final latents, rewards, prompts."""

    prompts: list[str]
    states: list[torch.Tensor]  # N tensors [B, C, H, W]: x_t before each step, then the final latents
    logps: torch.Tensor  # [N, B]
    rewards_B: torch.Tensor
    emb: torch.Tensor


@torch.no_grad()
def ddpo_rollouts(tr: TrainerState, prompts: list[str], step: int) -> Rollouts:
    stack, cfg = tr.stack, tr.cfg.sampling
    generator = sample_generators(tr.cfg.seed, step, tr.rank * len(prompts), len(prompts))
    emb = stack.text_embeddings(prompts, cfg.guidance_scale)
    latents = stack.initial_latents(len(prompts), generator)
    eps = stack.eps_fn(tr.denoiser, cfg.guidance_scale)
    traj = stack.sample(
        eps, emb, latents, stack.steps(cfg.num_steps), eta=cfg.eta, generator=generator, record=True
    )
    images = stack.decode(traj.latents)
    rewards_B = per_sample(tr.reward(frames_as_images(images), frame_prompts(prompts, images)), images)
    return Rollouts(prompts, [*traj.states, traj.latents], torch.stack(traj.logps), rewards_B, emb)


def ddpo_backward(
    tr: TrainerState, ro: Rollouts, adv_B: torch.Tensor, idx: list[int], step: int, algo: DDPOConfig
) -> dict[str, float]:
    """Accumulate the clipped surrogate's gradient over the chosen steps of samples ``idx``."""
    stack, cfg = tr.stack, tr.cfg.sampling
    steps = stack.steps(cfg.num_steps)
    order = np.random.default_rng(seed_for(tr.cfg.seed, step, 7)).permutation(
        len(steps)
    )  # same on every rank
    chosen = sorted(order[: max(1, round(algo.timestep_fraction * len(steps)))].tolist())
    eps = stack.eps_fn(tr.denoiser, cfg.guidance_scale)
    micro = int(tr.cfg.batch.micro_batch_samples or len(idx))
    sums = {"ddpo_loss": 0.0, "clipfrac": 0.0, "approx_kl": 0.0}
    weight = 1.0 / (len(chosen) * len(idx))
    for start in range(0, len(idx), micro):
        sel = torch.tensor(idx[start : start + micro])
        emb = _select_emb(ro.emb, sel, len(ro.prompts))
        for j in chosen:
            x_t, x_prev = ro.states[j][sel], ro.states[j + 1][sel]
            e = eps(x_t, steps[j].t, emb)
            mean = S.ddim_mean(x_t, e, steps[j], cfg.eta)
            logp_B = S.ddim_logprob_B(x_prev, mean, S.ddim_sigma(steps[j], cfg.eta))
            loss, m = L.ddpo_loss(logp_B, ro.logps[j][sel], adv_B[sel], clip_range=algo.clip_range)
            (loss * len(sel) * weight).backward()
            sums["ddpo_loss"] += float(loss.detach()) * len(sel) * weight
            for name in ("clipfrac", "approx_kl"):
                sums[name] += m[name] * len(sel) * weight
    return sums


def _select_emb(emb: torch.Tensor, sel: torch.Tensor, batch: int) -> torch.Tensor:
    if emb.shape[0] == batch:
        return emb[sel]
    return torch.cat([emb[:batch][sel], emb[batch:][sel]])  # guided: [uncond; cond]


# ------------------------------------------------------------------------------------------------ state


def full_state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The trainable parameters and the optimizer state, gathered whole on every rank (CPU)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return {"model": {k: v for k, v in model_sd.items() if k in trainable}, "optimizer": optim_sd}


def load_full_state(model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    options = StateDictOptions(full_state_dict=True, strict=False)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=options,
    )


def export(tr: TrainerState, output_dir: Path) -> str:
    """Full fine-tuning: the whole pipeline folder; LoRA: ``pytorch_lora_weights.safetensors``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(tr.denoiser, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if tr.cfg.actor_train.strategy.lora is not None:
        target = output_dir / LORA_DIR
        if tr.rank == 0:
            tr.stack.save_lora(full, target)
        return str(target)
    target = output_dir / DIFFUSERS_DIR
    if tr.rank == 0:
        tr.stack.save_full(full, target)
    return str(target)
