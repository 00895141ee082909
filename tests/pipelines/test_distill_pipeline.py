"""The ``distill`` pipeline on Ray, CPU, tiny models: the student's KL to the teacher falls, transferred top-k
values and indices equal the teacher's exactly on both transfer paths, and a run killed after its first checkpoint
resumes to the same metrics, bit for bit.

One pipeline object serves every check (actors cost ~15 s each to start): a tiny-1m teacher warmed up briefly by
SFT, a tiny-1m student (two data-parallel ranks, so rows really travel to different ranks). The resume check
reuses that teacher's export (no second warm-up) for a short run in this process and the same run through
``python -m roll.core.cli`` in a subprocess, SIGKILLed after its first checkpoint and resumed with
``resume=auto`` (the approach of ``tests/pipelines/test_sft.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core import columns as C
from roll.pipelines.common import data as D
from roll.pipelines.distill import SPEC, DistillConfig
from roll.pipelines.distill.pipeline import DistillRecipe, with_sample_ids

pytestmark = pytest.mark.slow


def small_config(out: Path, **overrides: Any) -> DistillConfig:
    src = {"path": "builtin:arithmetic", "builtin_kind": "sft"}
    raw: dict[str, Any] = {
        "seed": 0,
        "output_dir": str(out),
        "max_steps": 12,
        "eval_every": 12,
        "student": {
            "num_workers": 2,
            "cpus_per_worker": 0.5,
            "model": {"path": "tiny-1m", "seed": 1},
            "strategy": {"optimizer": {"lr": 3e-3}},
        },
        "teacher": {"num_workers": 1, "cpus_per_worker": 0.5, "model": {"path": "tiny-1m", "seed": 7}},
        "teacher_warmup": {"steps": 30, "lr": 3e-3, "batch_size": 32},
        "distill": {"divergence": "forward_kl", "top_k": 16},
        "data": {
            "sources": [{**src, "max_samples": 512}],
            "eval_sources": [{**src, "split": "eval", "max_samples": 32}],
        },
        "tokenize": {"max_length": 64},
        "batch": {"prompts_per_step": 16, "micro_batch_samples": 8},
        "eval": {"batch_size": 32, "generate": False},
        "tracking": {"backends": ["jsonl"], "progress": False},
    }
    raw.update(overrides)
    return DistillConfig.model_validate(raw)


@pytest.fixture(scope="module")
def run(
    ray_local: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[DistillRecipe, Mapping[str, float]]]:
    pipeline = SPEC.build(small_config(tmp_path_factory.mktemp("distill")))
    try:
        pipeline._start_runtime()  # type: ignore[attr-defined]  # a Run: Ray and placement, without the loop
        recipe: DistillRecipe = pipeline.recipe  # type: ignore[attr-defined]
        recipe.setup()
        before = recipe.evaluate(0)
        yield recipe, before
    finally:
        pipeline.shutdown()


def test_student_kl_to_teacher_falls(run: tuple[DistillRecipe, Mapping[str, float]]) -> None:
    pipe, before = run
    for step in range(pipe.config.max_steps):
        metrics = pipe.train_step(step)
    after = pipe.evaluate(pipe.config.max_steps)
    assert metrics["train/kd/kd_mean"] > 0
    assert after["kd"] < 0.8 * before["kd"], (before, after)


def test_object_store_transfer_equals_teacher_exactly(
    run: tuple[DistillRecipe, Mapping[str, float]],
) -> None:
    pipe, _ = run
    batch = with_sample_ids(D.sft_batch(pipe.data.train[:7], pad_id=pipe.tokenizer.pad_token_id))
    direct = pipe.teacher.topk_logits(batch, 16)
    reordered = batch.select([6, 2, 0, 5, 1, 3, 4])  # the transfer matches by sample id, not position
    attached = pipe.transfer.attach(reordered)
    order = reordered.tensors[C.SAMPLE_ID]
    assert torch.equal(attached.tensors[C.TOPK_VALUES], direct.tensors[C.TOPK_VALUES][order])
    assert torch.equal(attached.tensors[C.TOPK_INDICES], direct.tensors[C.TOPK_INDICES][order])


def test_collective_transfer_equals_teacher_exactly(run: tuple[DistillRecipe, Mapping[str, float]]) -> None:
    pipe, _ = run
    batch = with_sample_ids(D.sft_batch(pipe.data.train[:7], pad_id=pipe.tokenizer.pad_token_id))
    direct = pipe.teacher.topk_logits(batch, 16)
    for key in ("t0", "t1"):  # a second round must not read the first round's store keys
        got = pipe.transfer.run(batch, key, pipe.student.received_topk)
        assert torch.equal(got.tensors[C.SAMPLE_ID], batch.tensors[C.SAMPLE_ID])
        assert torch.equal(got.tensors[C.TOPK_VALUES], direct.tensors[C.TOPK_VALUES])
        assert torch.equal(got.tensors[C.TOPK_INDICES], direct.tensors[C.TOPK_INDICES])


def test_collective_training_step_runs(run: tuple[DistillRecipe, Mapping[str, float]]) -> None:
    pipe, _ = run
    pipe.config.__dict__["transfer"] = "collective"  # same clusters, other path
    try:
        metrics = pipe.train_step(100)
    finally:
        pipe.config.__dict__["transfer"] = "object_store"
    assert metrics["train/units"] == pytest.approx(1.0)
    assert metrics["train/kd/kd_mean"] > 0


# ----------------------------------------------------------------------------------- resume after SIGKILL

RESUME_STEPS = 8


def resume_config(out: Path, teacher_path: str, **overrides: Any) -> DistillConfig:
    """8 steps, checkpoints every 3, the fixture's warmed-up teacher as a plain path, one student rank."""
    raw: dict[str, Any] = {
        "max_steps": RESUME_STEPS,
        "eval_every": 4,
        "student": {
            "num_workers": 1,
            "cpus_per_worker": 0.5,
            "model": {"path": "tiny-1m", "seed": 1},
            "strategy": {"optimizer": {"lr": 3e-3}},
        },
        "teacher": {"num_workers": 1, "cpus_per_worker": 0.5, "model": {"path": teacher_path}},
        "teacher_warmup": None,
        "checkpoint": {"every_n_steps": 3, "keep_last": 2},
        "resume": "auto",
    }
    return small_config(out, **{**raw, **overrides})


def _metrics(out: Path) -> dict[int, dict[str, float]]:
    """Metrics by step; a step logged twice (before the kill and after the resume) keeps its last line."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["metrics"] for row in rows}


def test_killed_run_resumes_to_the_same_metrics(
    run: tuple[DistillRecipe, Mapping[str, float]], tmp_path: Path, kill_and_resume: Any
) -> None:
    """Uninterrupted (here) and killed-then-resumed (``roll train`` subprocesses, the shared
    ``kill_and_resume`` fixture) runs log equal metrics."""
    from roll.core.config.loader import dump_yaml

    teacher = run[0].teacher_model.path
    reference = SPEC.build(resume_config(tmp_path / "reference", teacher))
    try:
        reference.run()
    finally:
        reference.shutdown()
    expected = _metrics(tmp_path / "reference")
    assert sorted(expected) == list(range(RESUME_STEPS + 1)) and "eval/kd" in expected[RESUME_STEPS]
    assert set(expected[0]) == {"eval/kd", "eval/loss"}  # step 0: the student before distillation
    yaml = tmp_path / "resume.yaml"
    yaml.write_text(dump_yaml(resume_config(tmp_path / "unused", teacher)), encoding="utf-8")
    assert kill_and_resume(yaml, [], expected, tmp_path) < RESUME_STEPS
