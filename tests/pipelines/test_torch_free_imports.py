"""The modules a torch-free driver needs import without torch (~550 MB resident in every process that loads it).

Issue 31's memory goal removes torch from the rlvr driver; this guards the parts already cut loose: the batch
container and the schedulers (numpy columns where torch is absent), the cluster runtime that names model roles by
:class:`~roll.core.cluster.WorkerRef`, the driver's side of the weight update, and the light role package. A new
top-level ``import torch`` in any of them, or in anything they import, fails here with the module's name.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

TORCH_FREE = (
    "roll.core.batch",
    "roll.core.scheduler",
    "roll.core.pipeline",
    "roll.core.cluster",
    "roll.workers.update_group",
    "roll.workers.roles",
    "roll.workers.metrics",
    "roll.pipelines.rlvr.data",
    "roll.pipelines.rlvr.reward_worker",
)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_without_torch(module: str) -> None:
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False", f"importing {module} imports torch"


def test_role_refs_name_the_role_classes() -> None:
    """``role_ref`` names a class the actors can import, and refuses names that are not roles."""
    from roll.workers.roles import ActorTrainWorker, role_ref

    assert role_ref("ActorTrainWorker").load() is ActorTrainWorker
    with pytest.raises(AttributeError, match=r"no worker role 'load_model'.*HybridActorWorker"):
        role_ref("load_model")
