"""Pure pieces of reward_fl against diffusers and hand-derived numbers: the DDIM step, its log-density, DDPO's
advantages and clipped loss, the eps regularizer."""

from __future__ import annotations

import math

import torch

from roll.diffusion import losses as L
from roll.diffusion import sampling as S


def _scheduler():  # type: ignore[no-untyped-def]
    from diffusers import DDIMScheduler

    sched = DDIMScheduler(
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    sched.set_timesteps(10)
    return sched


def test_ddim_step_equals_diffusers_deterministic_and_stochastic() -> None:
    """eta 0 and eta 1 (with the same noise) give diffusers' ``DDIMScheduler.step`` result."""
    sched = _scheduler()
    steps = S.ddim_steps(sched.alphas_cumprod, sched.timesteps.tolist(), float(sched.final_alpha_cumprod))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 8, 8, generator=gen)
    eps = torch.randn(2, 4, 8, 8, generator=gen)
    noise = torch.randn(2, 4, 8, 8, generator=gen)
    for i in (0, 5, 9):
        t = int(sched.timesteps[i])
        ref0 = sched.step(eps, t, x, eta=0.0).prev_sample
        torch.testing.assert_close(S.ddim_mean(x, eps, steps[i], 0.0), ref0)
        ref1 = sched.step(eps, t, x, eta=1.0, variance_noise=noise).prev_sample
        got1 = S.ddim_mean(x, eps, steps[i], 1.0) + S.ddim_sigma(steps[i], 1.0) * noise
        torch.testing.assert_close(got1, ref1)


def test_logprob_is_the_gaussian_density() -> None:
    """One pixel, sigma 0.5, x - mean = 1: log N = -1/(2*0.25) - log 0.5 - log sqrt(2 pi) = -2 + 0.6931 - 0.9189."""
    got = S.ddim_logprob_B(torch.tensor([[1.0]]), torch.tensor([[0.0]]), 0.5)
    torch.testing.assert_close(got, torch.tensor([-2.0 + math.log(2.0) - 0.5 * math.log(2 * math.pi)]))


def test_group_advantages_normalize_per_prompt() -> None:
    """Rewards [1, 3] -> mean 2, std 1 -> [-1, 1] (up to eps); a constant group gives zeros."""
    adv = L.group_advantages_PG(torch.tensor([[1.0, 3.0], [5.0, 5.0]]), eps=0.0 + 1e-12)
    torch.testing.assert_close(adv, torch.tensor([[-1.0, 1.0], [0.0, 0.0]]))


def test_ddpo_loss_clips_the_ratio() -> None:
    """A = 1, log-ratio log 2 (ratio 2), clip 0.2: max(-2, -1.2) = -1.2; A = -1: max(2, 1.2) = 2 (unclipped)."""
    logp = torch.tensor([math.log(2.0), math.log(2.0)])
    loss, metrics = L.ddpo_loss(logp, torch.zeros(2), torch.tensor([1.0, -1.0]), clip_range=0.2)
    torch.testing.assert_close(loss, torch.tensor((-1.2 + 2.0) / 2))
    assert metrics["clipfrac"] == 1.0


def test_eps_regularizer_pulls_only_the_trained_side() -> None:
    eps = torch.tensor([1.0, 2.0], requires_grad=True)
    base = torch.tensor([0.0, 0.0], requires_grad=True)
    reg = L.eps_regularizer(eps, base)
    reg.backward()
    assert float(reg.detach()) == 2.5  # (1 + 4) / 2
    torch.testing.assert_close(eps.grad, torch.tensor([1.0, 2.0]))
    assert base.grad is None
