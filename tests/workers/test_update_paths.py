"""Which weight-sync path a pair of roles gets, and the CUDA IPC path itself (``gpu``).

The choice is a pure function of placement (derived by hand from the rule in its docstring); the IPC test shares
a packed bucket from this process's GPU (one handle per tensor) and opens it in a second process, which must
see the same tensors.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest
import torch

from roll.workers.model_update import open_tensors, pack_bucket, pick_update_mode, share_bucket


@pytest.mark.parametrize(
    ("same", "colocated", "gpus", "one_node", "mode"),
    [
        (True, True, True, True, "in_process"),  # one hybrid cluster
        (False, True, True, True, "cuda_ipc"),  # trainer and vLLM share GPUs
        (False, False, True, True, "collective"),  # own GPUs: NCCL broadcast, even on one node
        (False, True, False, True, "object_store"),  # CPU, colocated
        (False, False, False, True, "object_store"),  # CPU, one node: shared memory
        (False, False, False, False, "collective"),  # CPU across nodes: gloo
    ],
)
def test_pick_update_mode(same: bool, colocated: bool, gpus: bool, one_node: bool, mode: str) -> None:
    assert pick_update_mode(same_cluster=same, colocated=colocated, gpus=gpus, one_node=one_node) == mode


def _open_in_child(handles: dict[str, Any], out: Any) -> None:
    named = open_tensors(handles, "child")
    out.put({k: v.cpu() for k, v in named.items()})


@pytest.mark.gpu
def test_cuda_ipc_bucket_opens_in_another_process() -> None:
    named = {"a.weight": torch.randn(3, 4), "b.bias": torch.arange(5, dtype=torch.bfloat16)}
    bucket = pack_bucket(named)
    handles, keep = share_bucket(bucket)
    assert keep.is_cuda and len(handles) == 1
    assert [name for name, _ in next(iter(handles.values()))] == ["a.weight", "b.bias"]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_open_in_child, args=(handles, out))
    child.start()
    got = out.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    for name, tensor in named.items():
        assert torch.equal(got[name], tensor), name
