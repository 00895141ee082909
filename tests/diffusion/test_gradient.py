"""DRaFT-1's gradient is the gradient of one explicit denoising step, and that gradient matches a finite
difference. Runs the trainer in this process (no Ray) on the warmed tiny kit, 3 sampling steps, 2 prompts."""

from __future__ import annotations

from pathlib import Path

import torch

from roll.core.cluster import WorkerContext
from roll.core.config.loader import load_config
from roll.diffusion import sampling as S
from roll.diffusion.reward_fl import DraftConfig, RewardFLConfig
from roll.diffusion.reward_fl import steps as T
from roll.diffusion.reward_fl.worker import DenoiserTrainer

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["a red circle on blue", "a green square on yellow"]
SEED = 5


def _trainer() -> DenoiserTrainer:
    cfg = load_config(
        ROOT / "examples" / "reward_fl.yaml",
        [
            "sampling.num_steps=3",
            "algorithm.k=1",
            "algorithm.kl_coef=0",
            "algorithm.gradient_checkpointing=false",
        ],
        model=RewardFLConfig,
    )
    trainer = DenoiserTrainer(WorkerContext("actor_train", 0, 1), cfg)
    trainer.setup()
    return trainer


def _last_step_loss(tr: DenoiserTrainer, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
    """The explicit computation: one DDIM step from the (fixed) second-to-last latents, decode, score."""
    step = tr.stack.steps(3)[-1]
    eps = tr.denoiser(x, torch.tensor(step.t), encoder_hidden_states=emb).sample
    images = tr.stack.decode(S.ddim_mean(x, eps, step, 0.0))
    return -tr.reward(images, PROMPTS).mean()


def test_draft_k1_gradient_is_the_explicit_last_step_and_matches_finite_differences(tiny_sd: Path) -> None:
    tr = _trainer()
    algo = tr.cfg.algorithm
    assert isinstance(algo, DraftConfig)
    loss, _ = T.draft_micro_loss(tr, PROMPTS, SEED, 0, algo)  # step SEED, the step's samples 0 and 1
    loss.backward()
    draft = {n: p.grad.clone() for n, p in tr.denoiser.named_parameters() if p.grad is not None}
    tr.denoiser.zero_grad(set_to_none=True)

    # the first two steps without gradients, from the same seeded noise
    stack = tr.stack
    with torch.no_grad():
        emb = stack.text_embeddings(PROMPTS, 1.0)
        latents = stack.initial_latents(len(PROMPTS), T.sample_generators(tr.cfg.seed, SEED, 0, 2))
        eps = stack.eps_fn(tr.denoiser, 1.0)
        x = stack.sample(eps, emb, latents, stack.steps(3)[:2]).latents
    explicit = _last_step_loss(tr, x, emb)
    explicit.backward()
    torch.testing.assert_close(explicit.detach(), loss.detach())
    assert len(draft) == sum(1 for p in tr.denoiser.parameters())  # every UNet parameter gets a gradient
    for name, p in tr.denoiser.named_parameters():
        torch.testing.assert_close(draft[name], p.grad, rtol=1e-4, atol=1e-7, msg=name)

    # finite difference of the explicit step in one bias entry of the output convolution
    bias = tr.denoiser.conv_out.bias
    h = 1e-2
    with torch.no_grad():
        bias[0] += h
        up = _last_step_loss(tr, x, emb)
        bias[0] -= 2 * h
        down = _last_step_loss(tr, x, emb)
        bias[0] += h
    fd = float((up - down) / (2 * h))
    assert abs(float(draft["conv_out.bias"][0])) > 1e-4  # a gradient worth comparing
    assert abs(fd - float(draft["conv_out.bias"][0])) < 0.05 * abs(fd) + 1e-5, (
        fd,
        float(draft["conv_out.bias"][0]),
    )
