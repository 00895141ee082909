"""Implementation of the ``reward_fl`` pipeline (see the package docstring for what it does).

Simplifications, on purpose: every rank holds the whole VAE, text encoder and reward (they are frozen and small
next to the denoiser); the driver draws each step's prompts (seeded by run seed and step, so a resumed run
draws the same ones) and each rank takes whole prompt groups; evaluation samples every eval prompt on every rank
(a sharded denoiser needs all ranks in each forward) and rank 0's images are kept.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from roll.core.config.sections import RoleConfig
from roll.core.run import RunHost
from roll.core.samples import spread
from roll.core.tracking import reduce_metrics
from roll.core.types import Phases
from roll.diffusion import outputs
from roll.diffusion.reward_fl.config import RewardFLConfig
from roll.diffusion.reward_fl.worker import DenoiserTrainer

if TYPE_CHECKING:
    from roll.diffusion.reward_fl.clusters import DenoiserTrainerCluster

logger = logging.getLogger(__name__)

ACTOR_DIR = "actor_train"
SAMPLES_DIR = "samples"
CURVE_FILE = "reward_curve.png"


class RewardFLRecipe:
    """Reward feedback learning on ``actor_train``."""

    def __init__(self, config: RewardFLConfig, host: RunHost) -> None:
        self.config = config
        self.host = host
        self.train_prompts = _train_prompts(config)
        self.history: dict[str, list[tuple[int, float]]] = {"train reward": [], "eval reward": []}
        self._images_writer: Any = None

    def phases(self) -> Phases:
        return Phases(evaluate=self.evaluate, teardown=self.teardown, export=self.export)

    def roles(self) -> Mapping[str, RoleConfig]:
        return {"actor_train": self.config.actor_train}

    def setup(self) -> None:
        self.trainer = cast(
            "DenoiserTrainerCluster",
            self.host.make_cluster("actor_train", DenoiserTrainer, init_args=(self.config,)),
        )
        self.trainer.setup()

    # ------------------------------------------------------------------------------------------ one step

    def train_step(self, step: int) -> Mapping[str, float]:
        if step == 0 and self.config.eval_every:
            self.host.tracker.log({f"eval/{k}": v for k, v in self.evaluate(0).items()}, 0)
        metrics = reduce_metrics(self.trainer.train_step(self.step_prompts(step), step))
        self.history["train reward"].append((step + 1, metrics["reward_mean"]))
        return {f"train/{k}": v for k, v in metrics.items()}

    def step_prompts(self, step: int) -> list[str]:
        """``prompts_per_step`` prompts drawn by (seed, step), each repeated ``samples_per_prompt`` times."""
        batch = self.config.batch
        rng = np.random.default_rng([self.config.seed, step])
        idx = rng.choice(len(self.train_prompts), size=batch.prompts_per_step, replace=False)
        return [self.train_prompts[i] for i in idx for _ in range(batch.samples_per_prompt)]

    # ------------------------------------------------------------------------------------------ evaluation

    def evaluate(self, step: int) -> Mapping[str, float]:
        out = self.trainer.evaluate(self.config.prompts.eval, self.config.eval.seed)[0]
        rewards = out["rewards"].float()
        self.history["eval reward"].append((step, float(rewards.mean())))
        images = out["images"].numpy()
        self.write_pictures(images, step)
        picture = f"{SAMPLES_DIR}/step_{step:06d}.png"  # the grid (frame strip) write_pictures drew
        prompts = self.config.prompts.eval
        self.host.log_eval_samples(
            [
                {"prompt": prompts[i], "reward": float(rewards[i]), "picture": f"{picture}, cell {i}"}
                for i in spread(len(prompts), self.host.samples.count)
            ]
        )
        channels_last = np.moveaxis(images, -3, -1)  # [B, (F,) H, W, 3]
        return {
            "reward_mean": float(rewards.mean()),
            "reward_min": float(rewards.min()),
            "diversity": outputs.pixel_diversity(channels_last),
        }

    def write_pictures(self, images: np.ndarray, step: int) -> None:
        """The sample grid (or frame strip and GIF), TensorBoard images, and the reward curve."""
        folder = self.host.output_dir / SAMPLES_DIR
        name = f"step_{step:06d}"
        if images.ndim == 5:  # [B, F, 3, H, W]
            videos = images.transpose(0, 1, 3, 4, 2)
            outputs.save_video(videos, folder / f"{name}.png", folder / f"{name}.gif")
            flat = videos.reshape(-1, *videos.shape[2:])
        else:
            flat = images.transpose(0, 2, 3, 1)
            outputs.save_grid(flat, self.config.eval.grid_columns, folder / f"{name}.png")
        self.tensorboard_images(flat, step)
        outputs.save_curve(self.history, self.host.output_dir / CURVE_FILE)

    def tensorboard_images(self, images_BHW3: np.ndarray, step: int) -> None:
        if "tensorboard" not in self.config.tracking.backends:
            return
        if self._images_writer is None:
            from torch.utils.tensorboard import SummaryWriter

            from roll.core.tracking import TENSORBOARD_DIR

            self._images_writer = SummaryWriter(
                log_dir=str(self.host.output_dir / TENSORBOARD_DIR / "images")
            )
        self._images_writer.add_images("eval/samples", images_BHW3, global_step=step, dataformats="NHWC")
        self._images_writer.flush()

    # ------------------------------------------------------------------------------------- checkpoints

    def save_files(self, directory: Path) -> None:
        self.trainer.save_checkpoint(str(directory / ACTOR_DIR))

    def load_files(self, directory: Path) -> None:
        self.trainer.load_checkpoint(str(directory / ACTOR_DIR))

    def state(self) -> Mapping[str, Any]:
        return {"history": {k: [list(p) for p in v] for k, v in self.history.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.history = {k: [(int(s), float(v)) for s, v in pts] for k, pts in state["history"].items()}

    def export(self, output_dir: Path) -> None:
        path = self.trainer.export(str(output_dir))[0]
        logger.info("exported the trained model to %s", path)

    def teardown(self) -> None:
        """Close the images writer (at shutdown, and before a restart: the next evaluation opens a new one)."""
        if self._images_writer is not None:
            self._images_writer.close()
            self._images_writer = None


def _train_prompts(config: RewardFLConfig) -> list[str]:
    if config.prompts.train == "builtin:shapes":
        from roll.diffusion.kit.shapes import all_captions

        return all_captions()
    return list(config.prompts.train)
