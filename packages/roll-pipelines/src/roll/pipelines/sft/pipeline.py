"""Implementation of the ``sft`` pipeline (see the package docstring for what it does).

Simplifications, on purpose: the whole dataset is tokenized up front and held in memory (offline SFT sets are
small; a streaming source is read once); evaluation decodes greedily for a fixed number of tokens on every rank
(a sharded model needs every rank in each forward), which is cheap for the short answers of built-in tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.columns import IGNORE_INDEX
from roll.core.config.sections import RoleConfig
from roll.core.run import RunHost
from roll.core.tracking import reduce_metrics
from roll.core.types import Phases
from roll.data.collate import collate_prompts
from roll.data.tasks import get_task
from roll.pipelines.common import data as D
from roll.pipelines.common.config import answer_source, trainer_spec
from roll.pipelines.common.export import export_hf
from roll.pipelines.common.feed import RowFeeder
from roll.pipelines.common.loop import optimizer_chunks, sum_metrics, train_chunks
from roll.pipelines.common.samples import answer_samples
from roll.pipelines.sft import SFTConfig
from roll.pipelines.sft.losses import SFTLoss
from roll.pipelines.sft.worker import SFTWorker

if TYPE_CHECKING:
    from roll.pipelines.sft.clusters import SFTCluster

logger = logging.getLogger(__name__)

ACTOR_DIR = "actor_train"


class SFTRecipe:
    """Supervised fine-tuning on ``actor_train``."""

    def __init__(self, config: SFTConfig, host: RunHost) -> None:
        self.config = config
        self.host = host
        self.loss_fn = SFTLoss()

    def phases(self) -> Phases:
        return Phases(evaluate=self.evaluate, export=self.export)

    def roles(self) -> Mapping[str, RoleConfig]:
        return {"actor_train": self.config.actor_train}

    def setup(self) -> None:
        cfg = self.config
        self.tokenizer = D.load_tokenizer(cfg.actor_train.model.path)
        self.data = D.prepare_data(cfg.data, cfg.tokenize, kind="sft", tokenizer=self.tokenizer)
        self.feeder = RowFeeder(len(self.data.train), cfg.batch.samples_per_step, seed=cfg.seed)
        spec = trainer_spec(cfg.actor_train, cfg.batch, cfg.max_steps)
        self.actor = cast("SFTCluster", self.host.make_cluster("actor_train", SFTWorker, init_args=(spec,)))
        self.actor.setup()

    # ------------------------------------------------------------------------------------------ one step

    def train_step(self, step: int) -> Mapping[str, float]:
        rows = self.next_rows()
        metrics = self.train(rows)
        return self.step_metrics(metrics)

    def next_rows(self) -> list[D.Row]:
        return D.select(self.data.train, self.feeder.next_indices())

    def train(self, rows: list[D.Row]) -> dict[str, float]:
        pad_id = self.tokenizer.pad_token_id
        chunks = [D.sft_batch(chunk, pad_id=pad_id) for chunk in optimizer_chunks(rows, self.config.batch)]
        return train_chunks(self.actor, chunks, self.loss_fn)

    def step_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        out = {f"train/{k}": v for k, v in metrics.items()}
        out["data/epoch"] = float(self.feeder.epoch)
        return out

    # ------------------------------------------------------------------------------------------ evaluation

    def evaluate(self, step: int) -> Mapping[str, float]:
        rows = self.eval_rows()
        if not rows:
            return {}
        metrics = self.eval_loss(rows)
        if self.config.eval.scores_answers(self.config.data):
            metrics["answer_accuracy"] = self.answer_accuracy(rows[: self.config.eval.max_generate])
        return metrics

    def eval_rows(self) -> list[D.Row]:
        return self.data.eval[: self.config.eval.max_rows]

    def eval_loss(self, rows: list[D.Row]) -> dict[str, float]:
        pad_id = self.tokenizer.pad_token_id
        sums = sum_metrics(
            [
                reduce_metrics(self.actor.eval_step(D.sft_batch(chunk, pad_id=pad_id)))
                for chunk in D.chunks(rows, self.config.eval.batch_size)
            ]
        )
        tokens = max(sums["tokens_sum"], 1.0)
        return {"loss": sums["nll_sum"] / tokens, "token_accuracy": sums["correct_sum"] / tokens}

    def eval_task(self) -> Any:
        src = answer_source(self.config.data)
        return get_task(src.path, **src.builtin_options) if src is not None else None

    def answer_accuracy(self, rows: list[D.Row]) -> float:
        """Fraction of ``rows`` whose greedy answer the task verifies; a few answers go to the samples log."""
        task = self.eval_task()
        answers = [
            (text, bool(task.verify(text, str(row["ground_truth"]))))
            for chunk in D.chunks(rows, self.config.eval.batch_size)
            for row, text in zip(chunk, self.greedy_answers(chunk))
        ]
        prompts, truths = [prompt_ids(row) for row in rows], [row["ground_truth"] for row in rows]
        self.host.log_eval_samples(
            answer_samples(prompts, truths, answers, self.tokenizer, self.host.samples.count)
        )
        return sum(ok for _, ok in answers) / len(rows)

    def greedy_answers(self, rows: list[D.Row]) -> list[str]:
        prompts = [{"prompt_ids": prompt_ids(row)} for row in rows]
        tensors = collate_prompts(prompts, pad_id=self.tokenizer.pad_token_id)
        batch = Batch({k: tensors[k] for k in (C.INPUT_IDS, C.ATTENTION_MASK)})
        out = self.actor.generate_greedy(batch, self.config.eval.max_new_tokens)
        return [self.decode(ids) for ids in out[C.GENERATED_IDS]]

    def decode(self, ids_N: torch.Tensor) -> str:
        ids = ids_N.tolist()
        eos = self.tokenizer.eos_token_id
        if eos in ids:
            ids = ids[: ids.index(eos)]
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    # ------------------------------------------------------------------------------------- checkpoints

    def save_files(self, directory: Path) -> None:
        self.actor.save_checkpoint(str(directory / ACTOR_DIR))

    def load_files(self, directory: Path) -> None:
        self.actor.load_checkpoint(str(directory / ACTOR_DIR))

    def state(self) -> Mapping[str, Any]:
        return {"data": self.feeder.state(), "length_report": str(self.data.report)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.feeder.load_state(state["data"])

    def export(self, output_dir: Path) -> None:
        export_hf(self.actor, output_dir)


def prompt_ids(row: D.Row) -> list[int]:
    """The tokens before the first trained one: the conversation up to the assistant's generation prompt."""
    labels = list(row["labels"])
    first = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
    return list(row["input_ids"])[:first]
