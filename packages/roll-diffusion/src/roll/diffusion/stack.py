"""The text-to-image stack a trainer holds (``StableDiffusionPipeline`` components) and its sampler.

:class:`ImageStack` loads a diffusers folder (a kit preset, a local path or a hub id), and samples exactly as
``StableDiffusionPipeline.__call__`` does with a ``DDIMScheduler`` (same initial noise for the same generator,
same classifier-free guidance, same decode), so the exported folder reproduces the trainer's images. Unlike the
diffusers pipeline it can keep gradients through chosen steps (DRaFT), checkpoint them (AlignProp), stop early
and score the one-step ``x0_hat`` (ReFL), and record the stochastic sampler's trajectory with log-probs (DDPO).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from roll.diffusion import sampling as S
from roll.diffusion.kit.paths import resolve_diffusion_path

EpsFn = Callable[[torch.Tensor, float, torch.Tensor], torch.Tensor]
"""``(latents, timestep, text embeddings [2B or B, T, D]) -> eps``, guidance applied."""


def guided_embeddings(
    encode: Callable[[list[str]], torch.Tensor], prompts: list[str], guidance: float
) -> torch.Tensor:
    """``[B, T, D]``, or ``[2B, T, D]`` (unconditional first, as diffusers orders them) when guided."""
    cond = encode(prompts)
    return cond if guidance <= 1.0 else torch.cat([encode([""] * len(prompts)), cond])


def guided_output(
    call: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, guidance: float
) -> torch.Tensor:
    """``call(x)``, or with classifier-free guidance the doubled batch's two halves combined."""
    if guidance <= 1.0:
        return call(x)
    uncond, cond = call(torch.cat([x, x])).chunk(2)
    return S.guided_eps(uncond, cond, guidance)


@dataclass
class Trajectory:
    """What sampling returns: final latents, and for DDPO the visited latents and per-step log-probs."""

    latents: torch.Tensor
    states: list[torch.Tensor] = field(default_factory=list)  # x_t before each step, [B, C, H, W] each
    logps: list[torch.Tensor] = field(default_factory=list)  # [B] each
    eps: list[torch.Tensor] = field(default_factory=list)  # noise predictions of the grad-carrying steps
    grad_inputs: list[torch.Tensor] = field(default_factory=list)  # their inputs x_t
    grad_timesteps: list[float] = field(default_factory=list)


class ImageStack:
    """UNet, VAE, text encoder, tokenizer and DDIM schedule of one diffusers folder."""

    def __init__(self, path: str, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
        from diffusers import DDIMScheduler, StableDiffusionPipeline

        pipe = StableDiffusionPipeline.from_pretrained(
            resolve_diffusion_path(path), safety_checker=None, requires_safety_checker=False, dtype=dtype
        )
        self.pipe = pipe
        self.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
        self.unet = pipe.unet.to(device)
        self.denoiser = self.unet
        self.vae = pipe.vae.to(device).requires_grad_(False)
        self.text_encoder = pipe.text_encoder.to(device).requires_grad_(False)
        self.tokenizer = pipe.tokenizer
        self.device = device
        self.dtype = dtype
        self.vae_scale = 2 ** (len(self.vae.config.block_out_channels) - 1)
        self.image_size = int(self.unet.config.sample_size) * self.vae_scale

    # ------------------------------------------------------------------------------------------ pieces

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> torch.Tensor:
        ids = self.tokenizer(
            prompts,
            padding="max_length",
            max_length=self.tokenizer.model_max_length,
            truncation=True,
            return_tensors="pt",
        ).input_ids.to(self.device)
        return self.text_encoder(ids)[0]

    def text_embeddings(self, prompts: list[str], guidance: float) -> torch.Tensor:
        return guided_embeddings(self.encode, prompts, guidance)

    def initial_latents(self, batch: int, generator: S.Generators) -> torch.Tensor:
        from diffusers.utils.torch_utils import randn_tensor

        size = self.unet.config.sample_size
        shape = (batch, self.unet.config.in_channels, size, size)
        latents = randn_tensor(shape, generator=generator, device=self.device, dtype=self.dtype)
        return latents * self.scheduler.init_noise_sigma

    def steps(self, num_steps: int) -> list[S.DDIMStep]:
        self.scheduler.set_timesteps(num_steps)
        alphas = self.scheduler.alphas_cumprod
        return S.ddim_steps(
            alphas, self.scheduler.timesteps.tolist(), float(self.scheduler.final_alpha_cumprod)
        )

    def eps_fn(self, unet: Any, guidance: float) -> EpsFn:
        def eps(latents: torch.Tensor, t: float, emb: torch.Tensor) -> torch.Tensor:
            timestep = torch.tensor(t, device=self.device)
            return guided_output(
                lambda x: unet(x, timestep, encoder_hidden_states=emb).sample, latents, guidance
            )

        return eps

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` in [0, 1], differentiable (the VAE is frozen, not detached)."""
        image = self.vae.decode(latents / self.vae.config.scaling_factor).sample
        return (image / 2 + 0.5).clamp(0, 1)

    # ------------------------------------------------------------------------------------------ sampling

    def sample(
        self,
        eps: EpsFn,
        emb: torch.Tensor,
        latents: torch.Tensor,
        steps: list[S.DDIMStep],
        *,
        grad_from: int | None = None,
        stop_at: int | None = None,
        eta: float = 0.0,
        generator: S.Generators | None = None,
        record: bool = False,
        checkpointed: bool = False,
    ) -> Trajectory:
        """Run ``steps``; gradients kept from step index ``grad_from`` on (None: none); ``stop_at`` ends at that
        step with the one-step ``x0_hat`` (ReFL); ``eta > 0`` draws noise from ``generator`` (one, or one per sample) and, with
        ``record``, keeps states and log-probs (DDPO)."""
        traj = Trajectory(latents)
        x = latents
        for i, step in enumerate(steps):
            keep = grad_from is not None and i >= grad_from
            with torch.set_grad_enabled(keep):
                e = self._eps(eps, x, step.t, emb, keep and checkpointed)
                if keep:
                    traj.eps.append(e)
                    traj.grad_inputs.append(x)
                    traj.grad_timesteps.append(step.t)
                if stop_at is not None and i == stop_at:
                    traj.latents = S.predicted_x0(x, e, step)
                    return traj
                x_prev = self._step(x, e, step, eta, generator, traj if record else None)
            x = x_prev
        traj.latents = x
        return traj

    def _eps(self, eps: EpsFn, x: torch.Tensor, t: float, emb: torch.Tensor, ckpt: bool) -> torch.Tensor:
        if ckpt:
            out = checkpoint(eps, x, t, emb, use_reentrant=False)
            assert isinstance(out, torch.Tensor)
            return out
        return eps(x, t, emb)

    def _step(
        self,
        x: torch.Tensor,
        e: torch.Tensor,
        step: S.DDIMStep,
        eta: float,
        generator: S.Generators | None,
        traj: Trajectory | None,
    ) -> torch.Tensor:
        mean = S.ddim_mean(x, e, step, eta)
        sigma = S.ddim_sigma(step, eta)
        if sigma == 0.0:
            return mean
        noise = S.gaussian_like(x, generator)
        x_prev = mean + sigma * noise
        if traj is not None:
            traj.states.append(x.detach())
            traj.logps.append(S.ddim_logprob_B(x_prev, mean, sigma).detach())
        return x_prev

    # ------------------------------------------------------------------------------------------ export

    def save_full(self, unet_state: dict[str, torch.Tensor], target: Path) -> None:
        """The pipeline folder with the trained UNet (loaded into a fresh module from its full state dict)."""
        from diffusers import StableDiffusionPipeline, UNet2DConditionModel

        unet = UNet2DConditionModel.from_config(self.unet.config)
        unet.load_state_dict(unet_state)
        pipe: Any = StableDiffusionPipeline(
            unet=unet,
            vae=self.vae,
            text_encoder=self.text_encoder,
            tokenizer=self.tokenizer,
            scheduler=self.scheduler,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
        pipe.save_pretrained(target, safe_serialization=True)

    def save_lora(self, unet_state: dict[str, torch.Tensor], target: Path) -> None:
        """``pytorch_lora_weights.safetensors`` that ``pipe.load_lora_weights(target)`` reads."""
        from diffusers import StableDiffusionPipeline
        from diffusers.utils.state_dict_utils import convert_state_dict_to_diffusers
        from peft.utils import get_peft_model_state_dict

        layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(self.unet, state_dict=unet_state))
        StableDiffusionPipeline.save_lora_weights(target, unet_lora_layers=layers, safe_serialization=True)
