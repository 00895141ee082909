"""``RewardModelWorker``: a scalar score per sequence (``AutoModelForSequenceClassification``, one label)."""

from __future__ import annotations

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.workers.roles import _common
from roll.workers.roles.scalar import ScalarHeadModel
from roll.workers.roles.spec import TrainerSpec
from roll.workers.types import LossFn


class RewardModelWorker(Worker):
    """One data-parallel rank of a reward model, for scoring (``score``) and RM training (``train_step``; the
    loss receives ``ForwardOutput.scores_B``). The score is read at each row's last valid token by attention
    mask, so left/right padding and pad == eos both work (see :mod:`roll.workers.roles.heads`). Row methods dispatch
    by model-parallel group (``MP_SPLIT``: under megatron TP/PP peers get the same rows; DP_SPLIT under fsdp2)."""

    def __init__(self, ctx: WorkerContext, spec: TrainerSpec) -> None:
        super().__init__(ctx)
        _common.use_threads(spec.threads)
        self.core = ScalarHeadModel(self, spec, head="score")

    @register(Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        self.core.setup()

    @register(Dispatch.MP_SPLIT)
    def score(self, batch: Batch) -> Batch:
        """``scores_B`` (float32) for ``input_ids_BT`` / ``attention_mask_BT``."""
        return _common.scores_batch(batch, **{C.SCORES: self.core.forward(batch).scores_B})

    @register(Dispatch.MP_SPLIT)
    def train_step(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step; metrics as ``ActorTrainWorker.train_step``, the loss's own as ``reward/<name>``."""
        return self.core.train_step(batch, loss_fn, prefix="reward/")

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.core.save(path)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.core.load(path)

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        """``save_pretrained`` folder loadable by ``AutoModelForSequenceClassification``."""
        self.core.export(path)

    @register(Dispatch.ONE_TO_ALL)
    def offload(self) -> None:
        self.core.strategy.offload()

    @register(Dispatch.ONE_TO_ALL)
    def reload(self) -> None:
        self.core.strategy.reload()
