"""``DenoiserTrainer``: one data-parallel rank of ``reward_fl``. It holds the diffusion stack, the reward and the
optimizer, samples for its share of the step's prompts, and trains the denoiser (FSDP2 over the role's ranks).

Sampling is seeded per (run seed, step, sample index among the step's prompts) by explicit generators, one per
sample, never the process's global RNG: a resumed run draws the same noise as the uninterrupted one, and a sample
draws the same noise whichever rank and micro-batch it lands in (two ranks train as one on the whole batch).
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch

from roll.core import plugins
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.diffusion import losses as L
from roll.diffusion.reward_fl import steps as T
from roll.diffusion.reward_fl.config import REWARD_GROUP, DDPOConfig, DraftConfig, RewardFLConfig

logger = logging.getLogger(__name__)

STATE_FILE = "trainer.pt"


class DenoiserTrainer(Worker):
    """See the module docstring."""

    def __init__(self, ctx: WorkerContext, config: RewardFLConfig) -> None:
        super().__init__(ctx)
        self.cfg = config

    @register(Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        torch.set_flush_denormal(True)  # denormals made CPU steps several times slower
        cfg = self.cfg
        torch.set_num_threads(max(1, int(cfg.actor_train.cpus_per_worker)))
        strategy = cfg.actor_train.strategy
        if self.world_size > 1:
            self.init_process_group()
        self.device = _device(strategy.device, self.local_rank)
        dtype = torch.bfloat16 if strategy.dtype == "bf16" else torch.float32
        self.stack = T.load_stack(cfg.actor_train.model.path, self.device, dtype)
        self.base = self._base_denoiser()
        self.denoiser = self._trainable_denoiser()
        self.trainable = [p for p in self.denoiser.parameters() if p.requires_grad]
        opt = strategy.optimizer
        self.optimizer = torch.optim.AdamW(
            self.trainable, lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay
        )
        self.reward = _build_reward(cfg).to(self.device)
        if isinstance(cfg.algorithm, DraftConfig) and not self.reward.differentiable:
            raise T.DiffusionConfigError(
                f"reward.name: {cfg.reward.name!r} has no gradient; use algorithm.type: ddpo for it"
            )

    def _base_denoiser(self) -> Any:
        """A frozen copy for the KL term (LoRA needs none: disabling the adapters gives the base)."""
        algo = self.cfg.algorithm
        if not isinstance(algo, DraftConfig) or algo.kl_coef == 0 or self.cfg.actor_train.strategy.lora:
            return None
        return copy.deepcopy(self.stack.denoiser).requires_grad_(False)

    def _trainable_denoiser(self) -> Any:
        model = self.stack.denoiser
        lora = self.cfg.actor_train.strategy.lora
        if lora is not None:
            T.add_lora(model, lora)
        else:
            model.requires_grad_(True)
        model.train()
        if self.world_size > 1:
            T.shard(model)
        return model

    # ------------------------------------------------------------------------------------------ training

    @register(Dispatch.ONE_TO_ALL)
    def train_step(self, prompts: list[str], step: int) -> dict[str, float]:
        """Train on this rank's share of ``prompts`` (whole groups of ``samples_per_prompt``); its metrics."""
        mine = T.rank_share(prompts, self.rank, self.world_size)
        if isinstance(self.cfg.algorithm, DDPOConfig):
            return self._ddpo_step(mine, step, self.cfg.algorithm)
        return self._draft_step(mine, step, self.cfg.algorithm)

    def _draft_step(self, prompts: list[str], step: int, algo: DraftConfig) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        micro = int(self.cfg.batch.micro_batch_samples or len(prompts))
        offset = self.rank * len(prompts)  # this rank's first index among the step's prompts
        for start in range(0, len(prompts), micro):
            chunk = prompts[start : start + micro]
            loss, metrics = T.draft_micro_loss(self, chunk, step, offset + start, algo)
            (loss * len(chunk) / len(prompts)).backward()
            for name, value in metrics.items():
                sums[name] = sums.get(name, 0.0) + value * len(chunk) / len(prompts)
        sums["grad_norm"] = self._optimizer_step()
        return sums

    def _ddpo_step(self, prompts: list[str], step: int, algo: DDPOConfig) -> dict[str, float]:
        rollouts = T.ddpo_rollouts(self, prompts, step)
        g = self.cfg.batch.samples_per_prompt
        adv_B = L.group_advantages_PG(rollouts.rewards_B.view(-1, g), clip=algo.adv_clip).flatten()
        metrics = {
            "reward_mean": float(rollouts.rewards_B.mean()),
            "reward_std": float(rollouts.rewards_B.std()),
        }
        per_opt = self.cfg.batch.samples_per_optimizer_step // self.world_size
        for start in range(0, len(prompts), per_opt):
            idx = list(range(start, min(start + per_opt, len(prompts))))
            self.optimizer.zero_grad(set_to_none=True)
            metrics.update(T.ddpo_backward(self, rollouts, adv_B, idx, step, algo))
            metrics["grad_norm"] = self._optimizer_step()
        return metrics

    def _optimizer_step(self) -> float:
        max_norm = self.cfg.actor_train.strategy.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(self.trainable, max_norm if max_norm else float("inf"))
        self.optimizer.step()
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    # ------------------------------------------------------------------------------------------ eval

    @register(Dispatch.ONE_TO_ALL)
    @torch.no_grad()
    def evaluate(self, prompts: list[str], seed: int) -> dict[str, torch.Tensor]:
        """Deterministic (eta 0) samples of ``prompts`` from one generator seeded ``seed``, as
        ``pipe(prompts, generator=torch.Generator().manual_seed(seed))`` draws them; every rank runs it (a
        sharded denoiser needs all ranks in each forward)."""
        self.denoiser.eval()
        images = T.sample_images(self, prompts, torch.Generator().manual_seed(seed), eta=0.0)
        rewards_B = self.reward(T.frames_as_images(images), T.frame_prompts(prompts, images))
        self.denoiser.train()
        return {
            "images": (images * 255).round().to(torch.uint8).cpu(),
            "rewards": T.per_sample(rewards_B, images),
        }

    # ------------------------------------------------------------------------------------------ checkpoints

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        state = T.full_state(self.denoiser, self.optimizer)
        if self.rank == 0:
            Path(directory).mkdir(parents=True, exist_ok=True)
            torch.save(state, Path(directory) / STATE_FILE)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, directory: str) -> None:
        state = torch.load(Path(directory) / STATE_FILE, weights_only=False, map_location="cpu")
        T.load_full_state(self.denoiser, self.optimizer, state)

    @register(Dispatch.ONE_TO_ALL)
    def export(self, output_dir: str) -> str:
        """The trained model as a diffusers folder, or LoRA weights; returns the folder (rank 0 writes)."""
        return T.export(self, Path(output_dir))


def _device(name: str, local_rank: int) -> torch.device:
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(name)


def _build_reward(cfg: RewardFLConfig) -> Any:
    spec = plugins.load(REWARD_GROUP, cfg.reward.name)
    options = spec.config_model(**cfg.reward.options) if spec.config_model else cfg.reward.options
    return spec.build(options)
