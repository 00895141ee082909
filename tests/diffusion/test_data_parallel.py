"""Two FSDP2 data-parallel ranks of the denoiser train exactly as one rank on the whole batch.

Each sample's noise is drawn from its own generator, seeded by its index among the step's prompts (not by rank or
micro-batch), so splitting 8 prompts 4 + 4 over two ranks samples the same images; each rank's loss is the mean
over its 4 samples and FSDP2 averages the two ranks' gradients, which is the mean over all 8. After one DRaFT-1
step, the AdamW first moments (``exp_avg = (1 - beta1) * grad``: the gradients themselves) and the parameters of
the 2-rank run (gathered whole from its shards) equal the 1-rank run's to float rounding, and both logged the same
mean reward. With the earlier per-rank seeding, the two runs sampled different noise and differed at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core.cluster import Cluster, WorkerContext
from roll.core.config.loader import load_config
from roll.diffusion.reward_fl import RewardFLConfig
from roll.diffusion.reward_fl import steps as T
from roll.diffusion.reward_fl.worker import STATE_FILE, DenoiserTrainer

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [
    "a red circle on blue",
    "a green square on yellow",
    "a blue triangle on red",
    "a yellow circle on green",
    "a red square on yellow",
    "a green triangle on blue",
    "a blue square on green",
    "a yellow triangle on red",
]


def _config(workers: int) -> RewardFLConfig:
    overrides = [
        "sampling.num_steps=3",
        "batch.prompts_per_step=8",
        "batch.micro_batch_samples=2",  # micro-batches differ too: 4 of 2 on one rank, 2 of 2 on each of two
        f"actor_train.num_workers={workers}",
        "actor_train.cpus_per_worker=0.5",
    ]
    return load_config(ROOT / "examples" / "reward_fl.yaml", overrides, model=RewardFLConfig)


def _moments(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {str(k): v["exp_avg"] for k, v in state["optimizer"]["state"].items()}


def test_two_fsdp2_ranks_train_as_one_rank_on_the_whole_batch(
    ray_local: Any, tiny_sd: Path, tmp_path: Path
) -> None:
    cfg2 = _config(2)
    with Cluster("actor_train", DenoiserTrainer, cfg2.actor_train, init_args=(cfg2,)) as trainers:
        trainers.setup()
        two_metrics = trainers.train_step(PROMPTS, 3)
        trainers.save_checkpoint(str(tmp_path))
    two = torch.load(tmp_path / STATE_FILE, weights_only=False)

    one_tr = DenoiserTrainer(WorkerContext("actor_train", 0, 1), _config(1))
    one_tr.setup()
    before = {n: p.detach().clone() for n, p in one_tr.denoiser.named_parameters()}
    one_metrics = one_tr.train_step(PROMPTS, 3)
    one = T.full_state(one_tr.denoiser, one_tr.optimizer)

    assert [m["reward_mean"] for m in two_metrics] != [one_metrics["reward_mean"]] * 2  # each rank its half
    assert sum(m["reward_mean"] for m in two_metrics) / 2 == pytest.approx(
        one_metrics["reward_mean"], rel=1e-5
    )
    m1, m2 = _moments(one), _moments(two)
    assert m1.keys() == m2.keys() and len(m1) > 10
    for name in m1:
        torch.testing.assert_close(m2[name], m1[name], rtol=1e-4, atol=1e-9, msg=name)
    moved = 0
    for name, p in one["model"].items():
        torch.testing.assert_close(two["model"][name], p, rtol=1e-5, atol=1e-7, msg=name)
        moved += int(not torch.equal(p, before[name]))
    assert moved == len(before), "every parameter took a step"
