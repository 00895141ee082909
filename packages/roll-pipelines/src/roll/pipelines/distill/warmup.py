"""The optional teacher warm-up: SFT a teacher on its own role's resources, export it, hand back its new path.

Shared by the off-policy and on-policy distillation pipelines. The export is atomic (a temp folder renamed, then a
marker file), so a resumed run either finds a complete teacher and skips the phase or redoes it.

With ``cache: true`` the export goes to the user's cache dir instead (``<cache>/warmups/<role>-<hash>``, built once
under a file lock by :func:`roll.data._cache.build_once`), keyed on the recipe: the teacher's role config (model,
strategy, workers), the warm-up's steps, lr and batch sizes, the run's seed and a digest of the training rows
themselves (token ids, labels, pixels). Any later run, or test, with the same recipe reuses it without training.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.tracking import reduce_metrics
from roll.data._cache import build_once, cache_root, recipe_hash
from roll.data.collate import collate_prompts
from roll.data.vision import vision_columns
from roll.pipelines.common import data as D
from roll.pipelines.common.config import TrainRoleConfig
from roll.pipelines.common.export import export_hf
from roll.pipelines.common.feed import RowFeeder
from roll.pipelines.common.host import PipelineHost
from roll.pipelines.common.loop import TRAIN_METRIC_REDUCTION
from roll.pipelines.distill import TeacherWarmupConfig
from roll.pipelines.sft.losses import SFTLoss
from roll.pipelines.sft.worker import SFTWorker
from roll.workers.roles.config import ModelConfig
from roll.workers.roles.spec import TrainerSpec

if TYPE_CHECKING:
    from roll.pipelines.distill.clusters import DistillStudentCluster
    from roll.pipelines.sft.clusters import SFTCluster

logger = logging.getLogger(__name__)

DONE_MARKER = "WARMUP_DONE"
CACHE_KIND = "warmups"
RECIPE_VERSION = 1
"""Part of the cache key: bump it when the warm-up's training changes, so no run reads an old teacher."""

Summary = Callable[["SFTCluster"], dict[str, float]]
"""Extra metrics of the warmed-up teacher (e.g. its answer accuracy), computed before it is shut down."""


def warmup_strategy(teacher: TrainRoleConfig, warm: TeacherWarmupConfig) -> Any:
    """The teacher's strategy for its SFT warm-up: the warm-up's lr and micro-batch size."""
    micro = warm.micro_batch_samples or max(1, warm.batch_size // teacher.num_workers)
    optimizer = teacher.strategy.optimizer.model_copy(update={"lr": warm.lr})
    return teacher.strategy.model_copy(
        update={"optimizer": optimizer, "micro_batch_size": micro, "max_tokens_per_micro_batch": None}
    )


def warm_up_teacher(
    host: PipelineHost,
    role: str,
    teacher: TrainRoleConfig,
    warm: TeacherWarmupConfig,
    *,
    rows: Sequence[D.Row],
    pad_id: int,
    summary: Summary | None = None,
) -> ModelConfig:
    """SFT ``role``'s model on ``rows`` and export it to ``<output_dir>/<role>_warmup`` (or, with ``warm.cache``,
    to the cache folder of its recipe); the model to use next."""

    def run(export: Callable[[SFTCluster], object]) -> None:
        trainer = cast(
            "SFTCluster",
            host.make_cluster(
                role,
                SFTWorker,
                init_args=(
                    TrainerSpec(
                        model=teacher.model, strategy=warmup_strategy(teacher, warm), total_steps=warm.steps
                    ),
                ),
            ),
        )
        trainer.setup()
        metrics = _train(trainer, warm, rows, pad_id, seed=host.seed + 1, role=role)
        metrics.update(summary(trainer) if summary is not None else {})
        host.log({f"{role}_warmup/{k}": v for k, v in metrics.items()}, 0)
        export(trainer)
        trainer.shutdown()  # its bundles go to the frozen teacher next
        host.release_cluster(trainer)

    if warm.cache:
        target = cache_folder(role, teacher, warm, rows, seed=host.seed)
        was_there = target.is_dir()
        build_once(target, lambda tmp: run(lambda trainer: export_hf(trainer, tmp)))
        logger.info("%s warm-up: %s %s", role, "reusing" if was_there else "cached", target)
        target = target / "hf"
    else:
        target = host.output_dir / f"{role}_warmup"
        if (target / DONE_MARKER).exists():
            logger.info("%s warm-up: reusing %s", role, target)
        else:
            run(lambda trainer: _export(trainer, target))
    return teacher.model.model_copy(update={"path": str(target), "tokenizer": None})


def cache_folder(
    role: str, teacher: TrainRoleConfig, warm: TeacherWarmupConfig, rows: Sequence[D.Row], *, seed: int
) -> Path:
    """``<cache>/warmups/<role>-<hash of the recipe>`` (see the module docstring for what the recipe holds)."""
    recipe = {
        "teacher": teacher.model_dump(mode="json"),
        "warmup": warm.model_dump(mode="json", exclude={"data", "cache"}),
        "rows": rows_digest(rows),
        "seed": seed,
        "v": RECIPE_VERSION,
    }
    return cache_root() / CACHE_KIND / f"{role}-{recipe_hash(recipe)}"


def rows_digest(rows: Sequence[D.Row]) -> str:
    """sha256 of what the warm-up trains on: every row's ``input_ids`` and ``labels``, in order, and the bytes of
    its vision tensors (so other pictures, or other rows, make another key)."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps([list(row["input_ids"]), list(row["labels"])]).encode())
    for name, values in sorted(vision_columns(rows).items()):
        h.update(name.encode())
        for value in values:
            h.update(_tensor_bytes(value) if isinstance(value, torch.Tensor) else repr(value).encode())
    return h.hexdigest()


def _tensor_bytes(x: torch.Tensor) -> bytes:
    return (
        f"{x.dtype}{tuple(x.shape)}".encode()
        + x.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes()
    )


def _train(
    trainer: SFTCluster,
    warm: TeacherWarmupConfig,
    rows: Sequence[D.Row],
    pad_id: int,
    *,
    seed: int,
    role: str,
) -> dict[str, float]:
    feeder = RowFeeder(len(rows), warm.batch_size, seed=seed)
    loss, metrics = SFTLoss(), {"loss": float("nan")}
    for step in range(warm.steps):
        batch = D.sft_batch(D.select(rows, feeder.next_indices()), pad_id=pad_id)
        metrics = reduce_metrics(trainer.train_step(batch, loss), TRAIN_METRIC_REDUCTION)
        if (step + 1) % 10 == 0 or step + 1 == warm.steps:
            logger.info("%s warm-up step %d/%d: loss %.4f", role, step + 1, warm.steps, metrics["loss"])
    return {"loss": metrics["loss"]}


def _export(trainer: SFTCluster, target: Path) -> None:
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    export_hf(trainer, tmp)  # writes <tmp>/hf
    shutil.rmtree(target, ignore_errors=True)
    (tmp / "hf").rename(target)
    shutil.rmtree(tmp, ignore_errors=True)
    (target / DONE_MARKER).write_text("ok\n", encoding="utf-8")


def greedy_accuracy(
    cluster: SFTCluster | DistillStudentCluster,
    prompts: Sequence[Sequence[int]],
    truths: Sequence[str],
    *,
    verify: Callable[[str, str], bool],
    tokenizer: Any,
    batch_size: int,
    max_new_tokens: int,
    vision: Mapping[str, Sequence[Any]] | None = None,
    answers: list[tuple[str, bool]] | None = None,
) -> float:
    """Fraction of ``prompts`` (token ids) whose greedy answer under ``cluster`` (an SFTWorker role) ``verify``
    accepts against its ``truths`` entry; answers are cut at the tokenizer's EOS before decoding. ``vision``: the
    prompts' per-row image columns (:func:`roll.data.vision.vision_columns`), for image prompts. ``answers``, when
    given, receives each prompt's ``(answer text, verified)``."""
    correct, eos = 0, tokenizer.eos_token_id
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        tensors = collate_prompts([{"prompt_ids": list(p)} for p in chunk], pad_id=tokenizer.pad_token_id)
        images = {k: list(v[start : start + batch_size]) for k, v in (vision or {}).items()}
        batch = Batch({k: tensors[k] for k in (C.INPUT_IDS, C.ATTENTION_MASK)}, images)
        out = cluster.generate_greedy(batch, max_new_tokens)
        for truth, ids_T in zip(truths[start : start + batch_size], out[C.GENERATED_IDS]):
            ids = ids_T.tolist()
            text = tokenizer.decode(ids[: ids.index(eos)] if eos in ids else ids, skip_special_tokens=True)
            ok = bool(verify(str(text), str(truth)))
            correct += ok
            if answers is not None:
                answers.append((str(text), ok))
    return correct / max(len(prompts), 1)
