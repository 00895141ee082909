"""Implementation of the ``reward_model`` pipeline (see the package docstring)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.config.sections import RoleConfig
from roll.core.run import RunHost
from roll.core.types import Phases
from roll.pipelines.algorithms.preference import bradley_terry_loss
from roll.pipelines.common import data as D
from roll.pipelines.common.config import trainer_spec
from roll.pipelines.common.export import export_hf
from roll.pipelines.common.feed import RowFeeder
from roll.pipelines.common.loop import optimizer_chunks, train_chunks
from roll.pipelines.common.samples import pair_samples
from roll.pipelines.reward_model import RewardModelConfig
from roll.pipelines.reward_model.losses import BradleyTerryLoss
from roll.workers.roles.reward_model import RewardModelWorker

if TYPE_CHECKING:
    from roll.workers.roles.clusters import RewardModelCluster

MODEL_DIR = "reward_model"


class RewardModelRecipe:
    """Bradley-Terry training of a scalar-head model on ``actor_train``."""

    def __init__(self, config: RewardModelConfig, host: RunHost) -> None:
        self.config = config
        self.host = host
        self.loss_fn = BradleyTerryLoss()

    def phases(self) -> Phases:
        return Phases(evaluate=self.evaluate, export=self.export)

    def roles(self) -> Mapping[str, RoleConfig]:
        return {"actor_train": self.config.actor_train}

    def setup(self) -> None:
        cfg = self.config
        self.tokenizer = D.load_tokenizer(cfg.actor_train.model.path)
        self.data = D.prepare_data(cfg.data, cfg.tokenize, kind="preference", tokenizer=self.tokenizer)
        self.feeder = RowFeeder(len(self.data.train), cfg.batch.prompts_per_step, seed=cfg.seed)
        spec = trainer_spec(cfg.actor_train, cfg.batch, cfg.max_steps)
        self.model = cast(
            "RewardModelCluster", self.host.make_cluster("actor_train", RewardModelWorker, init_args=(spec,))
        )
        self.model.setup()

    # ------------------------------------------------------------------------------------------ one step

    def train_step(self, step: int) -> Mapping[str, float]:
        rows = D.select(self.data.train, self.feeder.next_indices())
        metrics = self.train(rows)
        return self.step_metrics(metrics)

    def train(self, rows: list[D.Row]) -> dict[str, float]:
        pad_id = self.tokenizer.pad_token_id
        chunks = [D.pair_batch(part, pad_id=pad_id) for part in optimizer_chunks(rows, self.config.batch)]
        return train_chunks(self.model, chunks, self.loss_fn)

    def step_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        out = {f"train/{k}": v for k, v in metrics.items()}
        out["data/epoch"] = float(self.feeder.epoch)
        out["data/skipped_identical_pairs"] = float(self.data.skipped.get("identical_pairs", 0))
        return out

    # ------------------------------------------------------------------------------------------ evaluation

    def evaluate(self, step: int) -> Mapping[str, float]:
        rows = self.data.eval[: self.config.eval.max_rows]
        if not rows:
            return {}
        scores_B = torch.cat([self.scores(chunk) for chunk in D.chunks(rows, self.config.eval.batch_size)])
        loss, metrics = bradley_terry_loss(scores_B[0::2], scores_B[1::2])
        shown = pair_samples(rows, scores_B[0::2].tolist(), scores_B[1::2].tolist(), self.tokenizer,
                             self.host.samples.count, value="score")  # fmt: skip
        self.host.log_eval_samples(shown)
        return {
            "loss": float(loss),
            "pairwise_accuracy": float(metrics["accuracy"]),
            "margin": float(metrics["margin"]),
        }

    def scores(self, rows: list[D.Row]) -> torch.Tensor:
        batch = D.pair_batch(rows, pad_id=self.tokenizer.pad_token_id)
        inputs = Batch(
            {C.INPUT_IDS: batch.tensors[C.INPUT_IDS], C.ATTENTION_MASK: batch.tensors[C.ATTENTION_MASK]}
        )
        scored: torch.Tensor = self.model.score(inputs).tensors[C.SCORES]
        return scored

    # ------------------------------------------------------------------------------------- checkpoints

    def save_files(self, directory: Path) -> None:
        self.model.save_checkpoint(str(directory / MODEL_DIR))

    def load_files(self, directory: Path) -> None:
        self.model.load_checkpoint(str(directory / MODEL_DIR))

    def state(self) -> Mapping[str, Any]:
        return {"data": self.feeder.state(), "skipped": dict(self.data.skipped)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.feeder.load_state(state["data"])

    def export(self, output_dir: Path) -> None:
        export_hf(self.model, output_dir)
