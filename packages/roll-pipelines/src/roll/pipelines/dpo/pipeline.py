"""Implementation of the ``dpo`` pipeline (see the package docstring).

Reference log-probs are one number per sequence (the summed, or averaged, response log-prob), kept per row:
``ref_logp_N2[i] = (chosen, rejected)`` of training row ``i``. In ``precompute`` mode they are computed before the
first step by the actor itself (its weights are still the initial ones) and saved with every checkpoint, so a
resumed run never recomputes them from trained weights. In ``worker`` mode the reference role scores each batch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster
from roll.core.columns import LABELS, REF_SEQ_LOGP
from roll.core.config.sections import RoleConfig
from roll.core.errors import CheckpointError
from roll.core.pipeline import BasePipeline
from roll.pipelines.common import data as D
from roll.pipelines.common.config import strategy_for
from roll.pipelines.common.export import export_hf
from roll.pipelines.common.feed import RowFeeder
from roll.pipelines.common.loop import optimizer_chunks, train_chunks
from roll.pipelines.dpo import DPOConfig
from roll.pipelines.dpo.losses import DPOLoss, preference_output, response_logp
from roll.workers.roles.actor import ActorTrainWorker
from roll.workers.roles.reference import ReferenceWorker

logger = logging.getLogger(__name__)

ACTOR_DIR = "actor_train"
REFERENCE_FILE = "reference_logps.pt"


class DPOPipeline(BasePipeline):
    """DPO-family training of ``actor_train`` against a frozen reference."""

    config: DPOConfig

    def __init__(self, config: DPOConfig) -> None:
        super().__init__(config, name="dpo")
        loss = config.loss
        self.loss_fn = DPOLoss(loss.type, loss.beta, loss.label_smoothing, loss.averages)
        self.ref_logps: dict[str, torch.Tensor] | None = None  # split -> [N, 2]; precompute mode
        self.reference: Cluster | None = None

    def roles(self) -> Mapping[str, RoleConfig]:
        roles: dict[str, RoleConfig] = {"actor_train": self.config.actor_train}
        if self.config.reference.mode == "worker":
            roles["reference"] = self.config.reference
        return roles

    def setup(self) -> None:
        cfg = self.config
        self.tokenizer = D.load_tokenizer(cfg.actor_train.model.path)
        self.data = D.prepare_data(cfg.data, cfg.tokenize, kind="preference", tokenizer=self.tokenizer)
        self.feeder = RowFeeder(len(self.data.train), cfg.batch.prompts_per_step, seed=cfg.seed)
        total = cfg.max_steps * cfg.batch.optimizer_steps_per_step
        strategy = strategy_for(cfg.actor_train, cfg.batch)
        self.actor = self.make_cluster(
            "actor_train", ActorTrainWorker, init_args=(cfg.actor_train.model, strategy, total, strategy.type)
        )
        self.actor.setup()
        if cfg.reference.mode == "worker":
            self.reference = self.start_reference()

    def start_reference(self) -> Cluster:
        ref = self.config.reference
        model = ref.model or self.config.actor_train.model
        cluster = self.make_cluster("reference", ReferenceWorker, init_args=(model, None, ref.strategy_name))
        cluster.setup()
        return cluster

    # ------------------------------------------------------------------------------------------ one step

    def train_step(self, step: int) -> Mapping[str, float]:
        indices = self.feeder.next_indices()
        batch = self.pairs(self.data.train, indices, split="train")
        metrics = self.train(batch)
        return self.step_metrics(metrics)

    def pairs(self, rows: list[D.Row], indices: list[int], *, split: str) -> Batch:
        """Interleaved pair batch of ``rows[indices]`` with the reference log-prob of every sequence."""
        batch = D.pair_batch(D.select(rows, indices), pad_id=self.tokenizer.pad_token_id)
        batch.tensors[REF_SEQ_LOGP] = self.reference_logp(batch, split, indices)
        return batch

    def reference_logp(self, batch: Batch, split: str, indices: list[int]) -> torch.Tensor:
        if self.reference is not None:
            return self.sequence_logp(self.reference, batch)
        if self.ref_logps is None:
            self.ref_logps = self.precompute_reference()
        return self.ref_logps[split][indices].reshape(-1)  # interleaved: chosen, rejected per pair

    def train(self, batch: Batch) -> dict[str, float]:
        rows = list(range(len(batch) // 2))
        parts = optimizer_chunks(rows, self.config.batch)
        chunks = [batch.select([2 * i + k for i in part for k in (0, 1)]) for part in parts]
        return train_chunks(self.actor, chunks, self.loss_fn)

    def step_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        out = {f"train/{k}": v for k, v in metrics.items()}
        out["data/epoch"] = float(self.feeder.epoch)
        out["data/skipped_identical_pairs"] = float(self.data.skipped.get("identical_pairs", 0))
        return out

    # ------------------------------------------------------------------------------------- reference

    def sequence_logp(self, cluster: Cluster, batch: Batch) -> torch.Tensor:
        """Each row's response log-prob (sum or mean, as the loss uses) under ``cluster``'s weights ``[B]``."""
        scored = cluster.compute_logprobs(_model_inputs(batch))
        return response_logp(scored.tensors[C.LOGP], batch.tensors[LABELS], average=self.loss_fn.average_logp)

    def precompute_reference(self) -> dict[str, torch.Tensor]:
        """``[N, 2]`` reference log-probs of every train and eval pair, from the still-untrained actor."""
        if self.step:
            raise CheckpointError(
                f"dpo: reference log-probs are missing at step {self.step}; the checkpoint lacks {REFERENCE_FILE}"
            )
        return {
            split: self.score_all(rows)
            for split, rows in (("train", self.data.train), ("eval", self.data.eval))
        }

    def score_all(self, rows: list[D.Row]) -> torch.Tensor:
        size = self.config.eval.batch_size
        parts = [
            self.sequence_logp(self.actor, D.pair_batch(chunk, pad_id=self.tokenizer.pad_token_id))
            for chunk in D.chunks(rows, size)
        ]
        return torch.cat(parts).reshape(-1, 2) if parts else torch.zeros(0, 2)

    # ------------------------------------------------------------------------------------------ evaluation

    def evaluate(self, step: int) -> Mapping[str, float]:
        rows = self.data.eval[: self.config.eval.max_rows]
        if not rows:
            return {}
        logp, ref = [], []
        for start in range(0, len(rows), self.config.eval.batch_size):
            indices = list(range(start, min(start + self.config.eval.batch_size, len(rows))))
            batch = self.pairs(self.data.eval, indices, split="eval")
            logp.append(self.sequence_logp(self.actor, batch))
            ref.append(batch.tensors[REF_SEQ_LOGP])
        return self.preference_metrics(torch.cat(logp), torch.cat(ref))

    def preference_metrics(self, logp_B: torch.Tensor, ref_logp_B: torch.Tensor) -> dict[str, float]:
        loss = self.config.loss
        out = preference_output(
            logp_B, ref_logp_B, loss_type=loss.type, beta=loss.beta, label_smoothing=loss.label_smoothing
        )
        return {"loss": float(out.loss), **{k: float(v) for k, v in out.metrics.items()}}

    # ------------------------------------------------------------------------------------- checkpoints

    def save_files(self, directory: Path) -> None:
        self.actor.save_checkpoint(str(directory / ACTOR_DIR))
        if self.ref_logps is not None:
            torch.save(self.ref_logps, directory / REFERENCE_FILE)

    def load_files(self, directory: Path) -> None:
        self.actor.load_checkpoint(str(directory / ACTOR_DIR))
        if self.config.reference.mode == "precompute":
            self.ref_logps = load_reference(directory / REFERENCE_FILE)

    def state(self) -> Mapping[str, Any]:
        return {"data": self.feeder.state(), "skipped": dict(self.data.skipped)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.feeder.load_state(state["data"])

    def export(self, output_dir: Path) -> None:
        export_hf(self.actor, output_dir)


def _model_inputs(batch: Batch) -> Batch:
    return Batch({C.INPUT_IDS: batch.tensors[C.INPUT_IDS], C.ATTENTION_MASK: batch.tensors[C.ATTENTION_MASK]})


def load_reference(path: Path) -> dict[str, torch.Tensor]:
    if not path.exists():
        raise CheckpointError(
            f"{path.parent} has no {path.name}: it was not written by a dpo run with reference.mode=precompute"
        )
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded
