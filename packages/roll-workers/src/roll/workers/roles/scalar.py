"""What the critic and the reward model share: a backbone with a scalar head, trained by a train strategy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Worker
from roll.workers.roles import _common, checkpoint
from roll.workers.roles.config import ModelConfig
from roll.workers.roles.heads import SCORE_FORWARD, VALUE_FORWARD
from roll.workers.roles.model import Head, check_vocab, load_model, load_tokenizer
from roll.workers.types import ForwardOutput, LossFn, TrainStrategy


class ScalarHeadModel:
    """A head model plus its train strategy, owned by one worker (composition, not a base class)."""

    def __init__(
        self,
        worker: Worker,
        model: ModelConfig,
        strategy: Any,
        total_steps: int,
        strategy_name: str,
        head: Head,
    ) -> None:
        self.worker, self.model_cfg, self.strategy_cfg = worker, model, strategy
        self.total_steps, self.strategy_name, self.head = total_steps, strategy_name, head
        self.strategy: TrainStrategy  # built by setup()

    def setup(self) -> None:
        _common.join_default_group(self.worker)
        spec = _common.strategy_spec(self.strategy_name, "train", self.worker.role)
        model = load_model(self.model_cfg, self.worker.role, head=self.head)
        tokenizer = load_tokenizer(self.model_cfg, self.worker.role)
        check_vocab(tokenizer, model, self.model_cfg, self.worker.role)
        forward = VALUE_FORWARD if self.head == "value" else SCORE_FORWARD
        self.strategy = _common.build_train(
            spec, self.strategy_cfg, model, self.worker.role, total_steps=self.total_steps, forward=forward
        )

    def forward(self, batch: Batch) -> ForwardOutput:
        mb = _common.micro_batch(batch)
        return self.strategy.forward_only(mb[C.INPUT_IDS], mb[C.ATTENTION_MASK])

    def train_step(self, batch: Batch, loss_fn: LossFn, *, prefix: str) -> dict[str, float]:
        """One optimizer step; the loss's own metrics come back under ``prefix`` (the role's)."""
        limit = getattr(self.strategy_cfg, "max_tokens_per_micro_batch", None)
        _common.check_micro_batch_fits(batch, limit, self.worker.role, "strategy.max_tokens_per_micro_batch")
        return _common.train_on(self.strategy, batch, loss_fn, prefix=prefix)

    def save(self, path: str) -> None:
        checkpoint.save(self.strategy, Path(path), self.worker.rank)

    def load(self, path: str) -> None:
        checkpoint.load(self.strategy, Path(path), self.worker.rank)

    def export(self, path: str) -> None:
        """``save_pretrained`` folder of the head model (``AutoModelForTokenClassification`` for a value head,
        ``AutoModelForSequenceClassification`` for a score head). Collective."""
        self.strategy.export_hf(path)
