"""``distill`` on image rows (``distill_vlm``): a warmed tiny-vl-10m teacher teaches a tiny-vl-1m student on the
shapes task, both seeing the pictures. One run (``Pipeline.run``, eval at step 0 and at the end) checks:

- the student's held-out KL to the teacher falls below a fifth;
- the student's greedy answer accuracy on held-out pictures rises by a measured margin (see
  :func:`test_distilling_a_vlm_teacher_lowers_the_kl_and_raises_the_accuracy`);
- the teacher's transferred top-k depend on the image: the same rows with other pictures give other top-k values
  (so the teacher's forward really receives the pixels).

The teacher is the example's (``examples/distill_vlm.yaml``: 60 SFT steps at lr 3e-4) with ``teacher_warmup.cache``:
built once per recipe under the user's cache dir, so only the first run on a machine pays the warm-up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core import columns as C
from roll.core.run import Run
from roll.pipelines.common import data as D
from roll.pipelines.distill import VLM_SPEC, DistillConfig
from roll.pipelines.distill.pipeline import DistillRecipe, with_sample_ids

pytestmark = pytest.mark.slow

STEPS = 40
EVAL_PICTURES = 32
ACCURACY_MARGIN = 0.25


def _config(out: Path) -> DistillConfig:
    src = {"path": "builtin:shapes", "builtin_kind": "sft", "builtin_options": {"level": 0}}
    return DistillConfig.model_validate(
        {
            "pipeline": "distill_vlm",
            "seed": 0,
            "output_dir": str(out),
            "max_steps": STEPS,
            "eval_every": STEPS,
            "student": {
                "num_workers": 1,
                "cpus_per_worker": 0.5,
                "model": {"path": "tiny-vl-1m"},
                "strategy": {"optimizer": {"lr": 1e-3}},
            },
            "teacher": {"num_workers": 1, "cpus_per_worker": 0.5, "model": {"path": "tiny-vl-10m"}},
            "teacher_warmup": {"steps": 60, "lr": 3e-4, "batch_size": 32, "cache": True},
            "distill": {"divergence": "forward_kl", "top_k": 64, "kd_weight": 1.0},
            "data": {
                "sources": [{**src, "max_samples": 512}],
                "eval_sources": [{**src, "split": "eval", "max_samples": EVAL_PICTURES}],
            },
            "tokenize": {"max_length": 64},
            "batch": {"prompts_per_step": 16, "micro_batch_samples": 16},
            "eval": {"batch_size": EVAL_PICTURES, "max_generate": EVAL_PICTURES, "max_new_tokens": 8},
            "checkpoint": {"every_n_steps": 0},
            "tracking": {"backends": ["jsonl"], "progress": False},
        }
    )


def _logged(out: Path) -> dict[int, dict[str, float]]:
    """Every metric logged per step (step 0 has two lines: the teacher warm-up's, when it ran, and the eval)."""
    steps: dict[int, dict[str, float]] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["step"], {}).update(row["metrics"])
    return steps


def test_distilling_a_vlm_teacher_lowers_the_kl_and_raises_the_accuracy(
    ray_local: Any, tmp_path: Path
) -> None:
    """Measured (this config, 32 held-out level-0 pictures; the warmed teacher answers 1.0): seed 0, the test's,
    student accuracy 0.0 -> 0.625 and held-out kd 4.13 -> 0.134 from step 0 to step 40
    (accuracy at steps 0 / 10 / 20 / 30 / 40: 0.0 / - / - / - / 0.625); seed 1: 0.0 / 0.25 / 0.31 / 0.25 / 0.375,
    kd 4.12 -> 0.169; seed 2: 0.0 / 0.25 / 0.44 / 0.25 / 0.44, kd 4.13 -> 0.162. The least rise is 0.375.

    The random student answers nothing (0.0: it has no answer format); distillation teaches the format and a
    colour (three colours: 1/3 by chance), and with more steps the picture. The margin, 0.25 (8 pictures), fails
    if the student learns nothing from the teacher's top-k; the kd must fall below a fifth.
    """
    pipe = VLM_SPEC.build(_config(tmp_path))
    assert isinstance(pipe, Run) and isinstance(pipe.recipe, DistillRecipe)
    try:
        pipe.run()
        logged = _logged(tmp_path)
        before, after = logged[0], logged[STEPS]
        kd, acc = (
            (before["eval/kd"], after["eval/kd"]),
            (before["eval/answer_accuracy"], after["eval/answer_accuracy"]),
        )
        print(f"distill_vlm held-out kd {kd[0]:.4f} -> {kd[1]:.4f}, accuracy {acc[0]:.3f} -> {acc[1]:.3f}")
        assert kd[1] < 0.2 * kd[0], kd
        assert acc[1] >= acc[0] + ACCURACY_MARGIN, acc
        _teacher_sees_the_pictures(pipe.recipe)
    finally:
        pipe.shutdown()


def _teacher_sees_the_pictures(recipe: DistillRecipe) -> None:
    rows = recipe.data.eval[:4]
    swapped = [{**r, C.PIXEL_VALUES: rows[(i + 1) % 4][C.PIXEL_VALUES]} for i, r in enumerate(rows)]
    pad = recipe.tokenizer.pad_token_id
    same = recipe.teacher.topk_logits(with_sample_ids(D.sft_batch(rows, pad_id=pad)), 4)
    other = recipe.teacher.topk_logits(with_sample_ids(D.sft_batch(swapped, pad_id=pad)), 4)
    assert not torch.allclose(same.tensors[C.TOPK_VALUES], other.tensors[C.TOPK_VALUES])
