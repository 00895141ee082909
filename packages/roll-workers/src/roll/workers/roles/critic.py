"""``CriticWorker``: per-token values from a backbone with a one-label token-classification head."""

from __future__ import annotations

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.workers.roles import _common
from roll.workers.roles.scalar import ScalarHeadModel
from roll.workers.roles.spec import TrainerSpec
from roll.workers.types import LossFn


class CriticWorker(Worker):
    """One data-parallel rank of the critic. ``model.path`` may be a causal LM: the value head starts random
    (seeded by ``model.seed``). The critic's loss receives ``ForwardOutput.values_BT``. ``spec.threads`` sets
    torch's intra-op threads, as for :class:`~roll.workers.roles.actor.ActorTrainWorker`. Row methods dispatch by
    model-parallel group (``MP_SPLIT``: under megatron TP/PP peers get the same rows; DP_SPLIT under fsdp2)."""

    def __init__(self, ctx: WorkerContext, spec: TrainerSpec) -> None:
        super().__init__(ctx)
        _common.use_threads(spec.threads)
        self.core = ScalarHeadModel(self, spec, head="value")

    @register(Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        self.core.setup()

    @register(Dispatch.MP_SPLIT)
    def compute_values(self, batch: Batch) -> Batch:
        """``values_BT`` (float32, 0 on padding) for ``input_ids_BT`` / ``attention_mask_BT``."""
        return _common.scores_batch(batch, **{C.VALUES: self.core.forward(batch).values_BT})

    @register(Dispatch.MP_SPLIT)
    def train_step(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step; metrics as ``ActorTrainWorker.train_step``, the loss's own as ``critic/<name>``."""
        return self.core.train_step(batch, loss_fn, prefix="critic/")

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.core.save(path)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.core.load(path)

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        """``save_pretrained`` folder loadable by ``AutoModelForTokenClassification`` (one label: the value)."""
        self.core.export(path)

    @register(Dispatch.ONE_TO_ALL)
    def offload(self) -> None:
        self.core.strategy.offload()

    @register(Dispatch.ONE_TO_ALL)
    def reload(self) -> None:
        self.core.strategy.reload()
