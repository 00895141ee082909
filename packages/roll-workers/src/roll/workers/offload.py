"""Train state to host memory and back, for roles that time-share a device (one ``device_group``).

:class:`StateOffloader` copies every storage behind a model's parameters and gradients and an optimizer's state
tensors into host memory (pinned when it comes from CUDA) and then releases the device storage in place
(``untyped_storage().resize_(0)``); :meth:`StateOffloader.reload` regrows the same storages and copies the bytes
back. Working on storages rather than re-assigning ``param.data`` keeps every view valid: FSDP2's DTensor shards
(views of one flat buffer), tied embeddings (one storage, two names), the optimizer's references to its params.
Storages already empty (FSDP2's unsharded parameters between steps) are skipped.

The mechanism does not care which device the storages are on, which is how it is tested on CPU; the strategies
use it only for CUDA state (on CPU the state already lives in host memory, so there is nothing to free).

:func:`measured` wraps an offload or reload for the per-step metrics: seconds and device bytes freed (CUDA's
free-memory delta, device-wide, so it also sees vLLM's engine processes; 0 without CUDA).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

__all__ = ["StateOffloader", "measured", "train_state_tensors"]


def train_state_tensors(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> Iterator[torch.Tensor]:
    """Parameters, their gradients and every tensor in the optimizer's state (local shards of DTensors)."""
    for param in model.parameters():
        yield _local(param)
        if param.grad is not None:
            yield _local(param.grad)
    if optimizer is not None:
        for state in optimizer.state.values():
            yield from (_local(v) for v in state.values() if isinstance(v, torch.Tensor))


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)  # a DTensor: its shard on this rank
    return to_local() if callable(to_local) else t


class StateOffloader:
    """Releases storages to host copies and restores them; see the module docstring. Not thread-safe."""

    def __init__(self) -> None:
        self._saved: list[tuple[torch.UntypedStorage, torch.Tensor]] = []

    @property
    def offloaded(self) -> bool:
        return bool(self._saved)

    def offload(self, tensors: Iterable[torch.Tensor]) -> int:
        """Copy each distinct non-empty storage of ``tensors`` to host memory and free it; returns bytes freed."""
        if self._saved:
            return 0
        seen: set[int] = set()
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=storage.device.type == "cuda")
            host.copy_(_bytes_of(storage), non_blocking=True)
            self._saved.append((storage, host))
        _synchronize(self._saved)
        for storage, _ in self._saved:
            storage.resize_(0)
        return sum(host.numel() for _, host in self._saved)

    def reload(self) -> int:
        """Regrow every released storage and copy its bytes back; returns bytes restored."""
        restored = 0
        for storage, host in self._saved:
            storage.resize_(host.numel())
            _bytes_of(storage).copy_(host, non_blocking=True)
            restored += host.numel()
        _synchronize(self._saved)
        self._saved = []
        return restored


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat ``uint8`` tensor over the whole of ``storage``."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _synchronize(saved: list[tuple[torch.UntypedStorage, torch.Tensor]]) -> None:
    if any(storage.device.type == "cuda" for storage, _ in saved):
        torch.cuda.synchronize()


def measured(fn: Callable[[], Any]) -> dict[str, float]:
    """Run ``fn``; ``{"seconds": wall time, "freed_bytes": device free-memory gain (negative: memory taken)}``."""
    cuda = torch.cuda.is_available()  # also in a vLLM actor, whose engine (and CUDA use) is another process
    free_before = torch.cuda.mem_get_info()[0] if cuda else 0
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    free_after = torch.cuda.mem_get_info()[0] if cuda else 0
    return {"seconds": seconds, "freed_bytes": float(free_after - free_before)}
