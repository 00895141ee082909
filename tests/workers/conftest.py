"""Clusters shared by the worker-role test modules (test_roles, test_model_update, test_logits_transfer,
test_lora_update): an actor that imports torch costs ~15 s here, so these are built once per pytest run.

Sharing is sound because no test relies on the history of a shared cluster: a test that needs equal weights
puts them there first (a checkpoint loaded into both trainers, a sync into the inference workers) and asserts
relative to what it set. The shared clusters go down after the last test of this folder, before other folders'
tests, which may need the CPUs they reserve.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _roles_helpers import MODEL, ClusterSet, Spec, fsdp2, hf_infer

from roll.core.testing import tiny_role
from roll.workers.roles import ActorInferWorker, ActorTrainWorker
from roll.workers.roles.spec import GeneratorSpec, TrainerSpec

_TRAIN_KW = {"spec": TrainerSpec(model=MODEL, strategy=fsdp2(), total_steps=4)}

SHARED = ClusterSet(
    {
        "train1": Spec("actor_train", ActorTrainWorker, tiny_role(), _TRAIN_KW),
        "train2": Spec("actor_train", ActorTrainWorker, tiny_role(num_workers=2), _TRAIN_KW),
        "infer": Spec(
            "actor_infer",
            ActorInferWorker,
            tiny_role(num_workers=2),
            {"spec": GeneratorSpec(model=MODEL, strategy=hf_infer())},
        ),
    }
)
"""``train1`` (1 rank) and ``train2`` (2 ranks) fsdp2 trainers of tiny-1m; ``infer``: 2 hf inference ranks."""


@pytest.fixture(scope="session")
def shared_roles(ray_local: object) -> Iterator[ClusterSet]:
    """:data:`SHARED`, not yet waited for: call ``.start()`` early, ``.get()`` when the clusters are needed."""
    try:
        yield SHARED
    finally:
        SHARED.shutdown()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    here = Path(__file__).parent
    if nextitem is None or here not in Path(nextitem.path).parents:
        SHARED.shutdown()
