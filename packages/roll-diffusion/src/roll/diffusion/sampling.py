"""DDIM sampling as pure tensor functions: deterministic (eta 0, what ``StableDiffusionPipeline`` does with a
``DDIMScheduler``) or stochastic (eta > 0, DDPO's sampler), with the Gaussian log-density of each step.

One DDIM step (Song et al. 2021, eq. 12), with ``a_t`` the cumulative alpha at ``t`` and ``a_p`` at the previous
(less noisy) timestep::

    x0_hat = (x_t - sqrt(1 - a_t) eps) / sqrt(a_t)
    sigma  = eta * sqrt((1 - a_p) / (1 - a_t)) * sqrt(1 - a_t / a_p)
    mean   = sqrt(a_p) x0_hat + sqrt(1 - a_p - sigma^2) eps
    x_p    = mean + sigma z,   z ~ N(0, I)

``log p(x_p | x_t) = sum over pixels of -(x_p - mean)^2 / (2 sigma^2) - log sigma - log sqrt(2 pi)`` (DDPO,
Black et al. 2023, needs it for the ratio of the fine-tuned to the sampling policy). Shapes: ``B`` batch, ``C``
latent channels, ``H, W`` latent size (``...`` allows a frame axis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

Generators = torch.Generator | list[torch.Generator]
"""One generator for the whole batch, or one per sample (row ``i`` drawn from ``generators[i]``)."""


def gaussian_like(x: torch.Tensor, generator: Generators | None) -> torch.Tensor:
    """Standard normal noise shaped like ``x``, drawn on CPU (the same numbers on every device); with a list of
    generators each row comes from its own, so a sample's noise does not depend on the batch it is in."""
    if isinstance(generator, list):
        rows = [torch.randn((1, *x.shape[1:]), generator=g, dtype=x.dtype) for g in generator]
        return torch.cat(rows).to(x.device)
    return torch.randn(x.shape, generator=generator, device="cpu", dtype=x.dtype).to(x.device)


@dataclass(frozen=True)
class DDIMStep:
    """The scalars of one step: timestep ``t``, cumulative alphas at ``t`` and at the previous timestep."""

    t: int
    alpha_t: float
    alpha_prev: float


def ddim_steps(alphas_cumprod: torch.Tensor, timesteps: list[int], final_alpha: float) -> list[DDIMStep]:
    """The step table of a DDIM schedule (``timesteps`` descending; the last step goes to ``final_alpha``)."""
    steps = []
    for i, t in enumerate(timesteps):
        prev = timesteps[i + 1] if i + 1 < len(timesteps) else None
        alpha_prev = float(alphas_cumprod[prev]) if prev is not None else final_alpha
        steps.append(DDIMStep(t=int(t), alpha_t=float(alphas_cumprod[t]), alpha_prev=alpha_prev))
    return steps


def predicted_x0(x_t: torch.Tensor, eps: torch.Tensor, step: DDIMStep) -> torch.Tensor:
    """``x0_hat`` from the noise prediction (the ReFL one-step estimate)."""
    return (x_t - math.sqrt(1.0 - step.alpha_t) * eps) / math.sqrt(step.alpha_t)


def ddim_sigma(step: DDIMStep, eta: float) -> float:
    """The step's noise scale ``sigma`` (0 when ``eta`` is 0)."""
    a_t, a_p = step.alpha_t, step.alpha_prev
    return eta * math.sqrt((1.0 - a_p) / (1.0 - a_t)) * math.sqrt(1.0 - a_t / a_p)


def ddim_mean(x_t: torch.Tensor, eps: torch.Tensor, step: DDIMStep, eta: float) -> torch.Tensor:
    """The mean of ``x_p`` given ``x_t`` and the noise prediction."""
    sigma = ddim_sigma(step, eta)
    direction = math.sqrt(max(1.0 - step.alpha_prev - sigma**2, 0.0))
    return math.sqrt(step.alpha_prev) * predicted_x0(x_t, eps, step) + direction * eps


def ddim_logprob_B(x_prev: torch.Tensor, mean: torch.Tensor, sigma: float) -> torch.Tensor:
    """``log p(x_prev | x_t)`` summed over every non-batch axis, ``[B]`` (needs ``sigma > 0``)."""
    sq_B = (x_prev.detach() - mean).pow(2).flatten(1).sum(1)
    n = x_prev[0].numel()
    return -sq_B / (2.0 * sigma**2) - n * (math.log(sigma) + 0.5 * math.log(2.0 * math.pi))


def guided_eps(eps_uncond: torch.Tensor, eps_cond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance: ``eps_u + scale (eps_c - eps_u)`` (scale 1 is the conditional prediction)."""
    return eps_uncond + scale * (eps_cond - eps_uncond)
