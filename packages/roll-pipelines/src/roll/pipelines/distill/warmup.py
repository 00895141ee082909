"""The optional teacher warm-up: SFT a teacher on its own role's resources, export it, hand back its new path.

Shared by the off-policy and on-policy distillation pipelines. The export is atomic (a temp folder renamed, then a
marker file), so a resumed run either finds a complete teacher and skips the phase or redoes it.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster
from roll.core.pipeline import BasePipeline
from roll.core.tracking import reduce_metrics
from roll.data.collate import collate_prompts
from roll.pipelines.common import data as D
from roll.pipelines.common.config import TrainRoleConfig
from roll.pipelines.common.export import export_hf
from roll.pipelines.common.feed import RowFeeder
from roll.pipelines.common.loop import TRAIN_METRIC_REDUCTION
from roll.pipelines.distill import TeacherWarmupConfig
from roll.pipelines.sft.losses import SFTLoss
from roll.pipelines.sft.worker import SFTWorker
from roll.workers.roles.config import ModelConfig

logger = logging.getLogger(__name__)

DONE_MARKER = "WARMUP_DONE"

Summary = Callable[[Cluster], dict[str, float]]
"""Extra metrics of the warmed-up teacher (e.g. its answer accuracy), computed before it is shut down."""


def warmup_strategy(teacher: TrainRoleConfig, warm: TeacherWarmupConfig) -> Any:
    """The teacher's strategy for its SFT warm-up: the warm-up's lr and micro-batch size."""
    micro = warm.micro_batch_samples or max(1, warm.batch_size // teacher.num_workers)
    optimizer = teacher.strategy.optimizer.model_copy(update={"lr": warm.lr})
    return teacher.strategy.model_copy(
        update={"optimizer": optimizer, "micro_batch_size": micro, "max_tokens_per_micro_batch": None}
    )


def warm_up_teacher(
    pipeline: BasePipeline,
    role: str,
    teacher: TrainRoleConfig,
    warm: TeacherWarmupConfig,
    *,
    rows: Sequence[D.Row],
    pad_id: int,
    summary: Summary | None = None,
) -> ModelConfig:
    """SFT ``role``'s model on ``rows`` and export it to ``<output_dir>/<role>_warmup``; the model to use next."""
    target = pipeline.output_dir / f"{role}_warmup"
    if (target / DONE_MARKER).exists():
        logger.info("%s warm-up: reusing %s", role, target)
    else:
        trainer = pipeline.make_cluster(
            role,
            SFTWorker,
            init_args=(teacher.model, warmup_strategy(teacher, warm), warm.steps, teacher.strategy.type),
        )
        trainer.setup()
        metrics = _train(trainer, warm, rows, pad_id, seed=pipeline.config.seed + 1, role=role)
        metrics.update(summary(trainer) if summary is not None else {})
        pipeline.tracker.log({f"{role}_warmup/{k}": v for k, v in metrics.items()}, 0)
        _export(trainer, target)
        trainer.shutdown()  # its bundles go to the frozen teacher next
        pipeline.clusters.remove(trainer)
    return teacher.model.model_copy(update={"path": str(target), "tokenizer": None})


def _train(
    trainer: Cluster, warm: TeacherWarmupConfig, rows: Sequence[D.Row], pad_id: int, *, seed: int, role: str
) -> dict[str, float]:
    feeder = RowFeeder(len(rows), warm.batch_size, seed=seed)
    loss, metrics = SFTLoss(), {"loss": float("nan")}
    for step in range(warm.steps):
        batch = D.sft_batch(D.select(rows, feeder.next_indices()), pad_id=pad_id)
        metrics = reduce_metrics(trainer.train_step(batch, loss), TRAIN_METRIC_REDUCTION)
        if (step + 1) % 10 == 0 or step + 1 == warm.steps:
            logger.info("%s warm-up step %d/%d: loss %.4f", role, step + 1, warm.steps, metrics["loss"])
    return {"loss": metrics["loss"]}


def _export(trainer: Cluster, target: Path) -> None:
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    export_hf(trainer, tmp)  # writes <tmp>/hf
    shutil.rmtree(target, ignore_errors=True)
    (tmp / "hf").rename(target)
    shutil.rmtree(tmp, ignore_errors=True)
    (target / DONE_MARKER).write_text("ok\n", encoding="utf-8")


def greedy_accuracy(
    cluster: Cluster,
    prompts: Sequence[Sequence[int]],
    truths: Sequence[str],
    *,
    verify: Callable[[str, str], bool],
    tokenizer: Any,
    batch_size: int,
    max_new_tokens: int,
    vision: Mapping[str, Sequence[Any]] | None = None,
) -> float:
    """Fraction of ``prompts`` (token ids) whose greedy answer under ``cluster`` (an SFTWorker role) ``verify``
    accepts against its ``truths`` entry; answers are cut at the tokenizer's EOS before decoding. ``vision``: the
    prompts' per-row image columns (:func:`roll.data.vision.vision_columns`), for image prompts."""
    correct, eos = 0, tokenizer.eos_token_id
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        tensors = collate_prompts([{"prompt_ids": list(p)} for p in chunk], pad_id=tokenizer.pad_token_id)
        images = {k: list(v[start : start + batch_size]) for k, v in (vision or {}).items()}
        batch = Batch(
            {C.INPUT_IDS: tensors["input_ids"], C.ATTENTION_MASK: tensors["attention_mask"]}, images
        )
        out = cluster.generate_greedy(batch, max_new_tokens)
        for truth, ids_T in zip(truths[start : start + batch_size], out[C.GENERATED_IDS]):
            ids = ids_T.tolist()
            text = tokenizer.decode(ids[: ids.index(eos)] if eos in ids else ids, skip_special_tokens=True)
            correct += bool(verify(str(text), str(truth)))
    return correct / max(len(prompts), 1)
