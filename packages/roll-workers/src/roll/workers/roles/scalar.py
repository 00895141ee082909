"""What the critic and the reward model share: a backbone with a scalar head, trained by a train strategy."""

from __future__ import annotations

from pathlib import Path

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Worker
from roll.workers.roles import _common, checkpoint
from roll.workers.roles.heads import SCORE_FORWARD, VALUE_FORWARD
from roll.workers.roles.model import Head
from roll.workers.roles.spec import TrainerSpec
from roll.workers.types import ForwardOutput, LossFn, TrainStrategy


class ScalarHeadModel:
    """A head model plus its train strategy, owned by one worker (composition, not a base class)."""

    def __init__(self, worker: Worker, spec: TrainerSpec, head: Head) -> None:
        self.worker, self.spec, self.head = worker, spec, head
        self.strategy: TrainStrategy  # built by setup()

    def setup(self) -> None:
        forward = VALUE_FORWARD if self.head == "value" else SCORE_FORWARD
        self.strategy, _ = _common.build_trainer(self.worker, self.spec, head=self.head, forward=forward)

    def forward(self, batch: Batch) -> ForwardOutput:
        mb = _common.micro_batch(batch)
        return self.strategy.forward_only(mb[C.INPUT_IDS], mb[C.ATTENTION_MASK])

    def train_step(self, batch: Batch, loss_fn: LossFn, *, prefix: str) -> dict[str, float]:
        """One optimizer step; the loss's own metrics come back under ``prefix`` (the role's)."""
        limit = _common.token_budget(self.spec)
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
