"""Implementation of the off-policy ``distill`` pipeline (see the package docstring for what it does).

A step reads the next rows, cuts them into optimizer-step chunks, and for each chunk: ``transfer`` (teacher top-k
to the student ranks that hold the rows), then ``train`` (one optimizer step of :class:`~.losses.DistillLoss`).

Simplifications, on purpose: the dataset is tokenized up front and held in memory (as in SFT); the teacher is
frozen and holds no checkpoint state (a resumed run reloads it from its path, or from the warm-up export);
evaluation decodes greedily for a fixed number of tokens, as the SFT pipeline does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.config.sections import RoleConfig
from roll.core.run import RunHost
from roll.core.tracking import reduce_metrics
from roll.core.types import Phases
from roll.data.tasks import get_task
from roll.data.vision import vision_columns
from roll.pipelines.common import data as D
from roll.pipelines.common.config import answer_source, trainer_spec
from roll.pipelines.common.export import export_hf
from roll.pipelines.common.feed import RowFeeder
from roll.pipelines.common.host import PipelineHost
from roll.pipelines.common.loop import TRAIN_METRIC_REDUCTION, optimizer_chunks, sum_metrics
from roll.pipelines.common.samples import answer_samples
from roll.pipelines.distill import DistillConfig, TeacherWarmupConfig
from roll.pipelines.distill.checks import check_same_tokenizer
from roll.pipelines.distill.losses import DistillLoss
from roll.pipelines.distill.warmup import greedy_accuracy, warm_up_teacher
from roll.pipelines.distill.worker import DistillStudentWorker
from roll.pipelines.sft.pipeline import prompt_ids
from roll.workers.logits_transfer import align_to
from roll.workers.roles.config import ModelConfig
from roll.workers.roles.spec import ScorerSpec
from roll.workers.roles.teacher import TeacherWorker

if TYPE_CHECKING:
    from roll.pipelines.distill.clusters import DistillStudentCluster
    from roll.pipelines.sft.clusters import SFTCluster
    from roll.workers.roles.clusters import TeacherCluster

logger = logging.getLogger(__name__)

STUDENT_DIR = "student"
TRANSFER_GROUP = "distill-topk"


def model_key(role: str, model: ModelConfig) -> tuple[str, str]:
    """``(reference, config key)`` of the tokenizer a role loads."""
    if model.tokenizer:
        return model.tokenizer, f"{role}.model.tokenizer"
    return model.path, f"{role}.model.path"


def with_sample_ids(batch: Batch) -> Batch:
    """``batch`` plus ``sample_id_B`` = row number: the key the logits transfer matches rows by."""
    batch[C.SAMPLE_ID] = torch.arange(len(batch), dtype=torch.long)
    return batch


class TopkTransfer:
    """Teacher top-k logits onto the student's batch: through the driver (``object_store``) or point to point
    (``collective``: the student ranks receive inside ``train_distill``). See :mod:`roll.workers.logits_transfer`."""

    def __init__(self, teacher: TeacherCluster, student: DistillStudentCluster, k: int, mode: str) -> None:
        self.teacher, self.student, self.k, self.mode = teacher, student, k, mode
        self._joined = False

    def attach(self, batch: Batch) -> Batch:
        """``batch`` with ``topk_values_BTK`` / ``topk_indices_BTK`` of its rows (object-store path)."""
        topk = self.teacher.topk_logits(batch, self.k)
        return batch.union(align_to(topk, batch.tensors[C.SAMPLE_ID]))

    def join(self) -> None:
        """Build the transfer group: teacher ranks ``0..S-1``, then the student ranks (collective path)."""
        if self._joined:
            return
        addr, port = self.teacher.transfer_endpoint()
        world = self.teacher.world_size + self.student.world_size
        backend = "nccl" if self.student.role_cfg.gpus_per_worker > 0 else "gloo"
        sending = self.teacher.join_transfer_group.submit(TRANSFER_GROUP, addr, port, world, 0, backend)
        receiving = self.student.join_transfer_group.submit(
            TRANSFER_GROUP, addr, port, world, self.teacher.world_size, backend
        )
        sending.result()
        receiving.result()
        self._joined = True

    def run(self, batch: Batch, key: str, student_call: Any, *args: Any) -> Any:
        """Call ``student_call(batch, *args, receive=...)`` while the teacher ranks send its rows' top-k."""
        self.join()
        sending = self.teacher.send_topk.submit(batch, self.k, TRANSFER_GROUP, self.teacher.world_size, key)
        receive = {"name": TRANSFER_GROUP, "key": key, "num_sources": self.teacher.world_size, "k": self.k}
        result = student_call(batch, *args, receive=receive)
        sending.result()
        return result


class DistillRecipe:
    """Off-policy knowledge distillation from ``teacher`` into ``student``."""

    def __init__(self, config: DistillConfig, host: RunHost) -> None:
        self.config = config
        self.host = host
        d = config.distill
        self.loss = DistillLoss(
            divergence=d.divergence,
            kd_weight=d.kd_weight,
            student_temperature=d.student_temperature,
            teacher_temperature=d.teacher_temperature,
            alpha=d.alpha,
            beta=d.beta,
            mu=d.mu,
            distill_prompt=d.distill_prompt,
        )
        self.teacher_model = config.teacher.model

    def phases(self) -> Phases:
        return Phases(evaluate=self.evaluate, export=self.export)

    def roles(self) -> Mapping[str, RoleConfig]:
        return {"student": self.config.student, "teacher": self.config.teacher}

    # ------------------------------------------------------------------------------------------------ setup

    def setup(self) -> None:
        cfg = self.config
        self.tokenizer = D.load_tokenizer(cfg.student.model.tokenizer or cfg.student.model.path)
        self.check_tokenizers(cfg.teacher.model)
        self.image_processor = D.load_image_processor_for(cfg.student.model.path)  # None for a text student
        self.data = D.prepare_data(
            cfg.data, cfg.tokenize, kind="sft", tokenizer=self.tokenizer, image_processor=self.image_processor
        )
        self.feeder = RowFeeder(len(self.data.train), cfg.batch.samples_per_step, seed=cfg.seed)
        if cfg.teacher_warmup is not None:
            self.teacher_model = self.warm_up_teacher(cfg.teacher_warmup)
        self.teacher = cast(
            "TeacherCluster",
            self.host.make_cluster(
                "teacher", TeacherWorker, init_args=(ScorerSpec(model=self.teacher_model),)
            ),
        )
        spec = trainer_spec(cfg.student, cfg.batch, cfg.max_steps)
        self.student = cast(
            "DistillStudentCluster",
            self.host.make_cluster("student", DistillStudentWorker, init_args=(spec,)),
        )
        pending = [self.teacher.setup.submit(), self.student.setup.submit()]
        for call in pending:
            call.result()
        self.transfer = TopkTransfer(self.teacher, self.student, cfg.distill.top_k, cfg.transfer)

    def check_tokenizers(self, teacher: ModelConfig) -> None:
        """Teacher and student must tokenize identically (see :mod:`.checks`)."""
        s_ref, s_key = model_key("student", self.config.student.model)
        t_ref, t_key = model_key("teacher", teacher)
        teacher_tok = D.load_tokenizer(t_ref)
        check_same_tokenizer(
            self.tokenizer,
            teacher_tok,
            student_ref=s_ref,
            teacher_ref=t_ref,
            student_key=s_key,
            teacher_key=t_key,
        )

    # ----------------------------------------------------------------------------------------- teacher warm-up

    def warm_up_teacher(self, warm: TeacherWarmupConfig) -> ModelConfig:
        """SFT the teacher (see :mod:`.warmup`); ``warm.data`` defaults to the run's training rows."""
        cfg = self.config
        rows = self.data.train
        if warm.data is not None:
            rows = D.prepare_data(
                warm.data,
                cfg.tokenize,
                kind="sft",
                tokenizer=self.tokenizer,
                image_processor=self.image_processor,
            ).train
        return warm_up_teacher(
            PipelineHost.of(self.host), "teacher", cfg.teacher, warm, rows=rows, pad_id=self.tokenizer.pad_token_id,
            summary=self.warmup_summary,
        )  # fmt: skip

    def warmup_summary(self, trainer: SFTCluster) -> dict[str, float]:
        if self.eval_task() is None or not self.data.eval:
            return {}
        return {"answer_accuracy": self.answer_accuracy(trainer, self.eval_prompts())}

    # ------------------------------------------------------------------------------------------------ one step

    def train_step(self, step: int) -> Mapping[str, float]:
        if step == 0 and self.config.eval_every:  # the curve's start: the student before distillation
            self.host.tracker.log({f"eval/{k}": v for k, v in self.evaluate(0).items()}, 0)
        rows = D.select(self.data.train, self.feeder.next_indices())
        per_chunk = [
            self.distill(chunk, key=f"s{step}c{i}")
            for i, chunk in enumerate(optimizer_chunks(rows, self.config.batch))
        ]
        metrics = {f"train/{k}": v for k, v in per_chunk[-1].items()}
        metrics["train/tokens"] = sum(m["tokens"] for m in per_chunk)
        metrics["data/epoch"] = float(self.feeder.epoch)
        return metrics

    def distill(self, rows: Sequence[D.Row], *, key: str) -> dict[str, float]:
        """One optimizer step on ``rows``: transfer the teacher's top-k, train the student."""
        batch = with_sample_ids(D.sft_batch(rows, pad_id=self.tokenizer.pad_token_id))
        loss = self.loss.bind(batch.tensors)
        if self.config.transfer == "collective":
            per_rank = self.transfer.run(batch, key, self.student.train_distill, loss)
        else:
            per_rank = self.student.train_distill(self.transfer.attach(batch), loss)
        return reduce_metrics(per_rank, TRAIN_METRIC_REDUCTION)

    # ------------------------------------------------------------------------------------------------ evaluation

    def evaluate(self, step: int) -> Mapping[str, float]:
        rows = self.data.eval[: self.config.eval.max_rows]
        if not rows:
            return {}
        metrics = self.eval_kd(rows)
        if self.config.eval.scores_answers(self.config.data):
            prompts, answers = self.eval_prompts(), list[tuple[str, bool]]()
            metrics["answer_accuracy"] = self.answer_accuracy(self.student, prompts, answers)
            truths = [r["ground_truth"] for r in prompts]
            shown = answer_samples(
                [prompt_ids(r) for r in prompts], truths, answers, self.tokenizer, self.host.samples.count
            )
            self.host.log_eval_samples(shown)
        return metrics

    def eval_kd(self, rows: Sequence[D.Row]) -> dict[str, float]:
        """Held-out divergence to the teacher per distilled token (``kd``) and student NLL per answer token."""
        pad_id = self.tokenizer.pad_token_id
        kd_parts, nll_parts = [], []
        for chunk in D.chunks(rows, self.config.eval.batch_size):
            batch = self.transfer.attach(with_sample_ids(D.sft_batch(chunk, pad_id=pad_id)))
            kd_parts.append(reduce_metrics(self.student.eval_distill(batch, self.loss)))
            nll_parts.append(reduce_metrics(self.student.eval_step(D.sft_batch(chunk, pad_id=pad_id))))
        kd, nll = sum_metrics(kd_parts), sum_metrics(nll_parts)
        return {
            "kd": kd["kd_sum"] / max(kd["kd_tokens_sum"], 1.0),
            "loss": nll["nll_sum"] / max(nll["tokens_sum"], 1.0),
        }

    def eval_task(self) -> Any:
        src = answer_source(self.config.data)
        return get_task(src.path, **src.builtin_options) if src is not None else None

    def eval_prompts(self) -> list[D.Row]:
        return self.data.eval[: self.config.eval.max_generate]

    def answer_accuracy(
        self,
        cluster: DistillStudentCluster | SFTCluster,
        rows: Sequence[D.Row],
        answers: list[tuple[str, bool]] | None = None,
    ) -> float:
        """Fraction of ``rows`` whose greedy answer under ``cluster`` (an SFTWorker role) the task verifies;
        ``answers`` receives each row's ``(answer, verified)``."""
        return greedy_accuracy(
            cluster, [prompt_ids(r) for r in rows], [str(r["ground_truth"]) for r in rows],
            verify=self.eval_task().verify, tokenizer=self.tokenizer, batch_size=self.config.eval.batch_size,
            max_new_tokens=self.config.eval.max_new_tokens, vision=vision_columns(rows), answers=answers,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------------ checkpoints

    def save_files(self, directory: Path) -> None:
        self.student.save_checkpoint(str(directory / STUDENT_DIR))

    def load_files(self, directory: Path) -> None:
        self.student.load_checkpoint(str(directory / STUDENT_DIR))

    def state(self) -> Mapping[str, Any]:
        return {"data": self.feeder.state(), "teacher": self.teacher_model.path}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.feeder.load_state(state["data"])

    def export(self, output_dir: Path) -> None:
        export_hf(self.student, output_dir)
