"""The teacher warm-up cache's key (``teacher_warmup.cache: true``, :mod:`roll.pipelines.distill.warmup`): the same
recipe names the same folder, and anything that changes what the warm-up trains (another picture, another row,
another lr or seed, another teacher) names another; what it does not train on (the ``cache`` flag) does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core import columns as C
from roll.data._cache import CACHE_ENV
from roll.pipelines.distill import TeacherWarmupConfig
from roll.pipelines.distill.warmup import cache_folder
from roll.workers.roles.config import ModelConfig, TrainRoleConfig


def _rows(pixel: float = 1.0) -> list[dict[str, Any]]:
    row = {"input_ids": [5, 6, 7], "labels": [-100, 6, 7], C.IMAGE_GRID_THW: torch.tensor([[1, 2, 2]])}
    return [{**row, C.PIXEL_VALUES: torch.full((4, 8), pixel)}, {**row, C.PIXEL_VALUES: None}]


def test_the_cache_key_follows_what_the_warm_up_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    teacher = TrainRoleConfig(model=ModelConfig(path="tiny-vl-10m"))
    warm = TeacherWarmupConfig(steps=60, lr=3e-4, cache=True)
    key = cache_folder("teacher", teacher, warm, _rows(), seed=0)
    assert key.parent == tmp_path / "warmups" and key.name.startswith("teacher-")
    assert key == cache_folder("teacher", teacher, warm.model_copy(update={"cache": False}), _rows(), seed=0)
    others = [
        cache_folder("teacher", teacher, warm, _rows(pixel=0.5), seed=0),
        cache_folder("teacher", teacher, warm, _rows()[:1], seed=0),
        cache_folder("teacher", teacher, warm.model_copy(update={"lr": 1e-3}), _rows(), seed=0),
        cache_folder("teacher", teacher, warm, _rows(), seed=1),
        cache_folder("teacher", TrainRoleConfig(model=ModelConfig(path="tiny-vl-1m")), warm, _rows(), seed=0),
    ]
    assert len({key, *others}) == 1 + len(others)
