"""Implementation of the ``dpo`` pipeline (see the package docstring).

Reference log-probs are one number per sequence (the summed, or averaged, response log-prob), kept per row:
``ref_logp_N2[i] = (chosen, rejected)`` of training row ``i``. In ``precompute`` mode they are computed before the
first step by the actor itself (its weights are still the initial ones) and saved with every checkpoint, so a
resumed run never recomputes them from trained weights. In ``worker`` mode the reference role scores each batch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.columns import DESIRABLE, LABELS, REF_SEQ_LOGP
from roll.core.config.sections import RoleConfig
from roll.core.errors import CheckpointError, DataError
from roll.core.run import RunHost
from roll.core.types import Phases
from roll.data.tokenize import Kind
from roll.pipelines.algorithms.preference import kto_loss, kto_reference_point
from roll.pipelines.common import data as D
from roll.pipelines.common.config import trainer_spec
from roll.pipelines.common.export import export_hf
from roll.pipelines.common.feed import RowFeeder
from roll.pipelines.common.loop import optimizer_chunks, train_chunks
from roll.pipelines.common.samples import pair_samples
from roll.pipelines.dpo import DPOConfig
from roll.pipelines.dpo.losses import DPOLoss, KTOLoss, preference_output, response_logp
from roll.workers.roles.actor import ActorTrainWorker
from roll.workers.roles.reference import ReferenceWorker
from roll.workers.roles.spec import ScorerSpec

if TYPE_CHECKING:
    from roll.workers.roles.clusters import ActorTrainCluster, ReferenceCluster

logger = logging.getLogger(__name__)

ACTOR_DIR = "actor_train"
REFERENCE_FILE = "reference_logps.pt"


class DPORecipe:
    """DPO-family training of ``actor_train`` against a frozen reference (none for SimPO).

    KTO reads unpaired rows; its reference point is estimated each step from mismatched pairs: row ``i`` of the
    split with the completion of row ``i - 1`` (a fixed derangement of the split, as TRL's rotation within a
    batch, so that ``precompute`` can score them once). Reference log-probs are ``[N, 2]`` per split either way:
    (chosen, rejected) of a pair, or (completion, mismatched completion) of a KTO row.
    """

    def __init__(self, config: DPOConfig, host: RunHost) -> None:
        self.config = config
        self.host = host
        loss = config.loss
        self.kto = loss.type == "kto"
        self.loss_fn: DPOLoss | KTOLoss
        if loss.type == "kto":
            self.loss_fn = KTOLoss(
                loss.beta, 0.0, loss.desirable_weight, loss.undesirable_weight, loss.averages
            )
        else:
            self.loss_fn = DPOLoss(
                loss.type, loss.beta, loss.label_smoothing, loss.averages, gamma=loss.simpo_gamma
            )
        self.ref_logps: dict[str, torch.Tensor] | None = None  # split -> [N, 2]; precompute mode
        self.reference: ReferenceCluster | None = None

    def phases(self) -> Phases:
        return Phases(evaluate=self.evaluate, export=self.export)

    def roles(self) -> Mapping[str, RoleConfig]:
        roles: dict[str, RoleConfig] = {"actor_train": self.config.actor_train}
        if self.config.reference.mode == "worker" and self.config.loss.needs_reference:
            roles["reference"] = self.config.reference
        return roles

    def setup(self) -> None:
        cfg = self.config
        self.tokenizer = D.load_tokenizer(cfg.actor_train.model.path)
        kind: Kind = "unpaired" if self.kto else "preference"
        self.data = D.prepare_data(cfg.data, cfg.tokenize, kind=kind, tokenizer=self.tokenizer)
        if self.kto and len(self.data.train) < 2:
            raise DataError(
                "KTO needs at least 2 training rows: its KL term pairs each prompt with another completion"
            )
        self.feeder = RowFeeder(len(self.data.train), cfg.batch.prompts_per_step, seed=cfg.seed)
        spec = trainer_spec(cfg.actor_train, cfg.batch, cfg.max_steps)
        self.actor = cast(
            "ActorTrainCluster", self.host.make_cluster("actor_train", ActorTrainWorker, init_args=(spec,))
        )
        self.actor.setup()
        if cfg.reference.mode == "worker" and cfg.loss.needs_reference:
            self.reference = self.start_reference()

    def start_reference(self) -> ReferenceCluster:
        ref = self.config.reference
        model = ref.model or self.config.actor_train.model
        cluster = cast(
            "ReferenceCluster",
            self.host.make_cluster(
                "reference", ReferenceWorker, init_args=(ScorerSpec(model=model, strategy=ref.strategy),)
            ),
        )
        cluster.setup()
        return cluster

    # ------------------------------------------------------------------------------------------ one step

    def train_step(self, step: int) -> Mapping[str, float]:
        indices = self.feeder.next_indices()
        batch, kl = self.pairs(self.data.train, indices, split="train")
        metrics = self.train(batch, kl)
        return self.step_metrics(metrics)

    def pairs(self, rows: list[D.Row], indices: list[int], *, split: str) -> tuple[Batch, float]:
        """The batch of ``rows[indices]`` with the reference log-prob of every sequence: interleaved pairs, or
        KTO's unpaired rows; and KTO's reference point over these rows (0 for the pair losses)."""
        if self.kto:
            batch = D.unpaired_batch(D.select(rows, indices), pad_id=self.tokenizer.pad_token_id)
        else:
            batch = D.pair_batch(D.select(rows, indices), pad_id=self.tokenizer.pad_token_id)
        if self.config.loss.needs_reference:
            ref_N2 = self.reference_logp(batch, split, indices, rows)
            batch.tensors[REF_SEQ_LOGP] = ref_N2[:, 0] if self.kto else ref_N2.reshape(-1)
        kl = self.kto_kl(rows, indices, ref_N2[:, 1]) if self.kto else 0.0
        return batch, kl

    def reference_logp(self, batch: Batch, split: str, indices: list[int], rows: list[D.Row]) -> torch.Tensor:
        """``[len(indices), 2]``: (chosen, rejected) of each pair, or (completion, mismatched) of a KTO row."""
        if self.reference is not None:
            matched_B = self.sequence_logp(self.reference, batch)
            if not self.kto:
                return matched_B.reshape(-1, 2)
            return torch.stack(
                [matched_B, self.sequence_logp(self.reference, self.kl_batch(rows, indices))], -1
            )
        if self.ref_logps is None:
            self.ref_logps = self.precompute_reference()
        return self.ref_logps[split][indices]

    def kl_batch(self, rows: list[D.Row], indices: list[int]) -> Batch:
        """KTO's mismatched pairs of ``rows[indices]``: each prompt with the completion of the row before it."""
        donors = [rows[(i - 1) % len(rows)] for i in indices]
        return D.unpaired_batch(
            D.select(rows, indices), pad_id=self.tokenizer.pad_token_id, completions=donors
        )

    def kto_kl(self, rows: list[D.Row], indices: list[int], ref_kl_B: torch.Tensor) -> float:
        """KTO's reference point over these rows' mismatched pairs, under the current policy (before the step)."""
        policy_kl_B = self.sequence_logp(self.actor, self.kl_batch(rows, indices))
        return float(kto_reference_point(policy_kl_B, ref_kl_B.to(policy_kl_B)))

    def train(self, batch: Batch, kl: float) -> dict[str, float]:
        if isinstance(self.loss_fn, KTOLoss):
            parts = optimizer_chunks(list(range(len(batch))), self.config.batch)
            loss_fn = dataclasses.replace(self.loss_fn, kl=kl)
            return train_chunks(self.actor, [batch.select(part) for part in parts], loss_fn)
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

    def sequence_logp(self, cluster: ActorTrainCluster | ReferenceCluster, batch: Batch) -> torch.Tensor:
        """Each row's response log-prob (sum or mean, as the loss uses) under ``cluster``'s weights ``[B]``."""
        scored = cluster.compute_logprobs(_model_inputs(batch))
        return response_logp(scored.tensors[C.LOGP], batch.tensors[LABELS], average=self.loss_fn.average_logp)

    def precompute_reference(self) -> dict[str, torch.Tensor]:
        """``[N, 2]`` reference log-probs of every train and eval row, from the still-untrained actor."""
        if self.host.step:
            raise CheckpointError(
                f"dpo: reference log-probs are missing at step {self.host.step}; the checkpoint lacks {REFERENCE_FILE}"
            )
        return {
            split: self.score_all(rows)
            for split, rows in (("train", self.data.train), ("eval", self.data.eval))
        }

    def score_all(self, rows: list[D.Row]) -> torch.Tensor:
        size = self.config.eval.batch_size
        if self.kto:
            parts = [self.score_unpaired(rows, list(range(start, min(start + size, len(rows)))))
                     for start in range(0, len(rows), size)]  # fmt: skip
            return torch.cat(parts) if parts else torch.zeros(0, 2)
        parts = [
            self.sequence_logp(self.actor, D.pair_batch(chunk, pad_id=self.tokenizer.pad_token_id))
            for chunk in D.chunks(rows, size)
        ]
        return torch.cat(parts).reshape(-1, 2) if parts else torch.zeros(0, 2)

    def score_unpaired(self, rows: list[D.Row], indices: list[int]) -> torch.Tensor:
        """``[len(indices), 2]``: the actor's log-prob of each KTO row and of its mismatched pair."""
        matched = D.unpaired_batch(D.select(rows, indices), pad_id=self.tokenizer.pad_token_id)
        mismatched = self.kl_batch(rows, indices)
        return torch.stack(
            [self.sequence_logp(self.actor, matched), self.sequence_logp(self.actor, mismatched)], -1
        )

    # ------------------------------------------------------------------------------------------ evaluation

    def evaluate(self, step: int) -> Mapping[str, float]:
        rows = self.data.eval[: self.config.eval.max_rows]
        if not rows:
            return {}
        logp, ref, labels, kl = [], [], [], []
        for start in range(0, len(rows), self.config.eval.batch_size):
            indices = list(range(start, min(start + self.config.eval.batch_size, len(rows))))
            batch, batch_kl = self.pairs(self.data.eval, indices, split="eval")
            logp.append(self.sequence_logp(self.actor, batch))
            ref.append(batch.tensors.get(REF_SEQ_LOGP, torch.zeros(len(batch))))
            if self.kto:
                labels.append(batch.tensors[DESIRABLE])
                kl.append(batch_kl * len(indices))
        if self.kto:
            return self.kto_metrics(torch.cat(logp), torch.cat(ref), torch.cat(labels), sum(kl) / len(rows))
        logp_B, ref_B = torch.cat(logp), torch.cat(ref)
        implicit_B = self.config.loss.beta * (logp_B - ref_B)  # DPO's implicit reward; interleaved pairs
        shown = pair_samples(rows, implicit_B[0::2].tolist(), implicit_B[1::2].tolist(), self.tokenizer,
                             self.host.samples.count, value="implicit_reward")  # fmt: skip
        self.host.log_eval_samples(shown)
        return self.preference_metrics(logp_B, ref_B)

    def preference_metrics(self, logp_B: torch.Tensor, ref_logp_B: torch.Tensor) -> dict[str, float]:
        loss = self.config.loss
        out = preference_output(
            logp_B, ref_logp_B, loss_type=loss.type, beta=loss.beta, label_smoothing=loss.label_smoothing,  # type: ignore[arg-type]
            gamma=loss.simpo_gamma,
        )  # fmt: skip
        return {"loss": float(out.loss), **{k: float(v) for k, v in out.metrics.items()}}

    def kto_metrics(
        self, logp_B: torch.Tensor, ref_logp_B: torch.Tensor, labels_B: torch.Tensor, kl: float
    ) -> dict[str, float]:
        loss = self.config.loss
        out = kto_loss(logp_B, ref_logp_B, labels_B, kl=kl, beta=loss.beta,
                       desirable_weight=loss.desirable_weight, undesirable_weight=loss.undesirable_weight)  # fmt: skip
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
