"""Save and restore a train strategy's full state: model, optimizer, scheduler, RNG.

Layout of a checkpoint folder: ``model.safetensors`` (the strategy's ``model_state_dict``: full and unmerged,
written by rank 0; with LoRA it holds peft names, so training resumes with the adapter), ``optimizer.pt`` (the
strategy's ``save_optimizer``: fsdp2 writes the full optimizer and scheduler state from rank 0, megatron one file
per TP/PP rank) and ``rng_rank{r}.pt`` per rank. fsdp2's full (not sharded) states let a run resume on a
different number of ranks. Atomic renames are the CheckpointManager's job.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from roll.core.checkpoint import first_non_finite
from roll.core.errors import CheckpointError
from roll.workers.types import TrainStrategy

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"


def save(strategy: TrainStrategy, path: Path, rank: int) -> None:
    """Collective over the strategy's ranks. Weights holding NaN or inf are refused on every rank, before any
    file is written: a :class:`CheckpointError` naming the tensor."""
    state = strategy.model_state_dict()
    _refuse_non_finite(state, path)
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        save_file(_unshared(state), str(path / MODEL_FILE))
    _barrier()
    strategy.save_optimizer(path / OPTIMIZER_FILE)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(_rng_state(), str(path / f"rng_rank{rank}.pt"))
    _barrier()


def load(strategy: TrainStrategy, path: Path, rank: int) -> None:
    """Every rank reads the full model state and keeps its shard; then optimizer, scheduler and RNG."""
    model_file = path / MODEL_FILE
    if not model_file.exists():
        raise CheckpointError(f"no {MODEL_FILE} in checkpoint {path}")
    strategy.load_model_state_dict(load_file(str(model_file)))
    strategy.load_optimizer(path / OPTIMIZER_FILE)
    rng_file = path / f"rng_rank{rank}.pt"
    if rng_file.exists():
        _set_rng_state(torch.load(str(rng_file), weights_only=False))


def _refuse_non_finite(state: dict[str, torch.Tensor], path: Path) -> None:
    """Rank 0 holds the full state (others ``{}``) and checks it; its verdict is broadcast so that every rank
    raises, rather than the others waiting at the next barrier for a rank that gave up."""
    verdict = [first_non_finite(state)]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise CheckpointError(
            f"refusing to save the model to {path}: tensor {verdict[0]}; the weights diverged (nothing was "
            "written)",
            tensor=verdict[0],
        )


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors sharing memory (tied embeddings): clone the second and later aliases."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        ptr = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone().contiguous() if ptr in seen else tensor.contiguous()
        seen.add(ptr)
    return out


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}
    state["python"] = random.getstate()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
