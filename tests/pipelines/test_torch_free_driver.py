"""The rlvr driver runs without torch (~550 MB resident in every process that loads it).

Issue 31's memory goal: batches reach the driver as numpy (:mod:`roll.core.batch`), model roles are named, not
imported (:class:`~roll.core.cluster.WorkerRef`), and the tensor work runs in the train actor
(:mod:`roll.pipelines.rlvr.tensor_work`). The import checks name the module that brings torch back; the run
check catches an import that happens only while a step runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

TORCH_FREE = (
    "roll.core.batch",
    "roll.core.scheduler",
    "roll.core.run",
    "roll.core.cluster",
    "roll.workers.update_group",
    "roll.workers.roles",
    "roll.workers.metrics",
    "roll.pipelines.rlvr.data",
    "roll.pipelines.rlvr.reward_worker",
    "roll.pipelines.rlvr.pipeline",
    "roll.pipelines.policy.group",
    "roll.pipelines.algorithms.losses",
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


DRIVER = """
import sys
from roll.core.cli import main
rc = main(["train", *sys.argv[1:]])
print("torch in the driver:", "torch" in sys.modules)
sys.exit(rc)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [[], ["algorithm.kl_mode=loss", "algorithm.kl_coef=0.05", "batch.samples_per_optimizer_step=128"]],
    ids=["quickstart", "reference-and-two-optimizer-steps"],
)
def test_a_quickstart_shaped_run_never_imports_torch_in_the_driver(
    ray_local: Any, tmp_path: Path, extra: list[str]
) -> None:
    """The quickstart (hybrid actor, reward worker, warm-up, held-out eval, TensorBoard), shortened: two GRPO
    steps after a 5-step warm-up, on the session's Ray; then with a reference (KL in the loss: its log-probs are
    masked on the driver, in numpy) and two optimizer steps (old log-probs, a seeded shuffle). The driver
    process reports whether torch came in."""
    args = [
        str(ROOT / "examples" / "quickstart.yaml"), f"output_dir={tmp_path}", "max_steps=2", "warmup.steps=5",
        "eval_every=2", "validation.num_prompts=16", "plot=false", "tracking.progress=false",
        f"ray.address={ray_local.address}", "ray.num_cpus=null", *extra,
    ]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "torch in the driver: False" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r["metrics"] for r in rows}
    assert {1, 2} <= set(steps) and "actor/loss" in steps[2] and "eval/accuracy" in steps[2]
    assert list(tmp_path.glob("tensorboard/**/events.out.tfevents*")) or list(
        tmp_path.glob("**/events.out.*")
    )


def test_response_masking_is_the_same_bits_in_numpy_and_torch() -> None:
    """What the driver does to reference/old log-probs without torch: ``logp * float32(mask)``, equal to torch's
    ``logp * mask.float()`` bit for bit (signed zeros included)."""
    import numpy as np
    import torch

    from roll.core import columns as C
    from roll.core.batch import Batch
    from roll.pipelines.policy.group import on_response

    logp = torch.tensor([[-0.5, -1.25, -3.0e-8], [-2.0, -0.0, -7.5]])
    batch = Batch({C.RESPONSE_MASK: torch.tensor([[0, 1, 1], [1, 1, 0]])})
    in_torch = on_response(logp, batch)
    in_numpy = on_response(logp.numpy(), batch.to_numpy())  # type: ignore[arg-type]
    assert isinstance(in_numpy, np.ndarray) and in_numpy.dtype == np.float32
    assert in_numpy.tobytes() == in_torch.numpy().tobytes()
    numpy_batch = batch.to_numpy()
    numpy_batch[C.REF_LOGP] = in_numpy  # a numpy batch takes a numeric array as a tensor column
    assert C.REF_LOGP in numpy_batch.tensors
