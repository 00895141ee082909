"""The video stack (Wan family) a trainer holds, with the same interface as :class:`~roll.diffusion.stack.ImageStack`.

Flow matching: the transformer predicts a velocity ``v`` and one Euler step is ``x <- x + (sigma_next - sigma) v``
(what ``FlowMatchEulerDiscreteScheduler.step`` does); the one-step clean estimate is ``x - sigma v``. Sampling is
deterministic, so DDPO (which needs a stochastic sampler's log-probs) is not offered for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from roll.diffusion import sampling as S
from roll.diffusion.kit.video import FRAMES
from roll.diffusion.stack import EpsFn, Trajectory, guided_embeddings, guided_output


class FlowStep:
    def __init__(self, t: float, sigma: float, sigma_next: float) -> None:
        self.t, self.sigma, self.sigma_next = t, sigma, sigma_next


class VideoStack:
    """Transformer, VAE, text encoder and flow-matching schedule of one ``WanPipeline`` folder."""

    def __init__(self, path: str, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
        from diffusers import WanPipeline

        pipe = WanPipeline.from_pretrained(path, dtype=dtype)
        self.pipe = pipe
        self.scheduler = pipe.scheduler
        self.denoiser = pipe.transformer.to(device)
        self.vae = pipe.vae.to(device).requires_grad_(False)
        self.text_encoder = pipe.text_encoder.to(device).requires_grad_(False)
        self.tokenizer = pipe.tokenizer
        self.device, self.dtype = device, dtype
        self.image_size = 16
        self.frames = FRAMES

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> torch.Tensor:
        tok = self.tokenizer(
            prompts,
            padding="max_length",
            max_length=self.tokenizer.model_max_length,
            truncation=True,
            return_tensors="pt",
        )
        return self.text_encoder(tok.input_ids.to(self.device), tok.attention_mask.to(self.device))[0]

    def text_embeddings(self, prompts: list[str], guidance: float) -> torch.Tensor:
        return guided_embeddings(self.encode, prompts, guidance)

    def initial_latents(self, batch: int, generator: S.Generators) -> torch.Tensor:
        from diffusers.utils.torch_utils import randn_tensor

        z = self.vae.config.z_dim
        size = self.image_size // self.vae.config.scale_factor_spatial
        shape = (batch, z, self.frames, size, size)
        return randn_tensor(shape, generator=generator, device=self.device, dtype=self.dtype)

    def steps(self, num_steps: int) -> list[FlowStep]:
        self.scheduler.set_timesteps(num_steps)
        sig = self.scheduler.sigmas.tolist()
        ts = self.scheduler.timesteps.tolist()
        return [FlowStep(ts[i], sig[i], sig[i + 1]) for i in range(num_steps)]

    def eps_fn(self, model: Any, guidance: float) -> EpsFn:
        def velocity(x: torch.Tensor, t: float, emb: torch.Tensor) -> torch.Tensor:
            def call(inp: torch.Tensor) -> torch.Tensor:
                timestep = torch.full((inp.shape[0],), t, device=self.device)
                return model(
                    hidden_states=inp, timestep=timestep, encoder_hidden_states=emb, return_dict=False
                )[0]

            return guided_output(call, x, guidance)

        return velocity

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``[B, F, 3, H, W]`` in [0, 1]."""
        mean = torch.tensor(self.vae.config.latents_mean, device=latents.device).view(1, -1, 1, 1, 1)
        std = torch.tensor(self.vae.config.latents_std, device=latents.device).view(1, -1, 1, 1, 1)
        video = self.vae.decode(latents * std + mean).sample  # [B, 3, F, H, W]
        return (video / 2 + 0.5).clamp(0, 1).permute(0, 2, 1, 3, 4)

    def sample(
        self,
        eps: EpsFn,
        emb: torch.Tensor,
        latents: torch.Tensor,
        steps: list[FlowStep],
        *,
        grad_from: int | None = None,
        stop_at: int | None = None,
        eta: float = 0.0,
        generator: S.Generators | None = None,
        record: bool = False,
        checkpointed: bool = False,
    ) -> Trajectory:
        if eta > 0 or record:
            raise ValueError("the flow-matching video sampler is deterministic: use sampling.eta 0 and draft")
        traj, x = Trajectory(latents), latents
        for i, step in enumerate(steps):
            keep = grad_from is not None and i >= grad_from
            with torch.set_grad_enabled(keep):
                v = (
                    checkpoint(eps, x, step.t, emb, use_reentrant=False)
                    if keep and checkpointed
                    else eps(x, step.t, emb)
                )
                if keep:
                    traj.eps.append(v)
                    traj.grad_inputs.append(x)
                    traj.grad_timesteps.append(step.t)
                if stop_at is not None and i == stop_at:
                    traj.latents = x - step.sigma * v
                    return traj
                x = x + (step.sigma_next - step.sigma) * v
        traj.latents = x
        return traj

    def save_full(self, state: dict[str, torch.Tensor], target: Path) -> None:
        from diffusers import WanPipeline, WanTransformer3DModel

        transformer = WanTransformer3DModel.from_config(self.denoiser.config)
        transformer.load_state_dict(state)
        parts = {k: getattr(self.pipe, k) for k in ("tokenizer", "text_encoder", "vae", "scheduler")}
        pipe: Any = WanPipeline(transformer=transformer, **parts)
        pipe.save_pretrained(target, safe_serialization=True)

    def save_lora(self, state: dict[str, torch.Tensor], target: Path) -> None:
        from diffusers import WanPipeline
        from diffusers.utils.state_dict_utils import convert_state_dict_to_diffusers
        from peft.utils import get_peft_model_state_dict

        layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(self.denoiser, state_dict=state))
        WanPipeline.save_lora_weights(target, transformer_lora_layers=layers, safe_serialization=True)
