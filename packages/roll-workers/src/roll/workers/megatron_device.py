"""Where the megatron strategy runs: the process's CUDA device over NCCL or, in a process without CUDA, the CPU over
gloo (Megatron-Core's ``GPTModel``, DDP, optimizer and schedules, unchanged).

Megatron-Core (0.16) assumes CUDA in a few places a CPU step reaches, and each of them can only raise where CUDA is
absent: factory calls with a literal ``device="cuda"`` (the default causal mask, the schedules' token count, the
clip-grad and FP32-optimizer buffers), ``torch.cuda.current_device()`` (rotary frequencies, TP gathers, DDP
buffers), the model-parallel RNG tracker (seeded and forked on the CUDA generator) and one assert that gradients
are ``torch.cuda.FloatTensor``. On CPU:

- :class:`CudaToCpu`, a ``TorchFunctionMode`` the strategy enters around each of its calls (:func:`device_scope`),
  creates on the CPU what is asked for on ``cuda``, keeps ``.cuda()`` and ``.to("cuda")`` on the CPU, and answers
  ``Tensor.type()`` with the CUDA type name (only that assert reads it). It is thread-local, like every mode, and
  does nothing on a CUDA machine, where :func:`device_scope` does not enter it.
- :func:`install_cpu_patches` (process-wide, once, only without CUDA) makes ``torch.cuda.current_device()``
  return ``"cpu"`` and the RNG tracker's ``fork`` a no-op: without CUDA both raise, and our transformer config
  turns dropout off, so the tracker's streams are never drawn from (weights come from the HF model, not its init).

Measured on CPU against the HF models (tests/workers/test_megatron_cpu.py): TP=1 and TP=2 forwards equal them to
1e-6, and one TP=2 training step equals the TP=1 step.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from roll.core.errors import ConfigError
from roll.workers.megatron_config import MegatronConfig

F = TypeVar("F", bound=Callable[..., Any])


def megatron_device() -> torch.device:
    """This process's CUDA device when CUDA is available (:func:`local_cuda_index`), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_cuda_index())
    return torch.device("cpu")


def resolve_precision(config: MegatronConfig, device: torch.device) -> MegatronConfig:
    """``config`` with ``precision: auto`` made concrete: bf16 on CUDA, fp32 on the CPU (as fsdp2's ``auto``)."""
    if config.precision != "auto":
        return config
    return config.model_copy(update={"precision": "bf16" if device.type == "cuda" else "fp32"})


def local_cuda_index() -> int:
    """This process's CUDA device: 0 when it sees one GPU (a Ray actor sees only its own through
    ``CUDA_VISIBLE_DEVICES``), else ``LOCAL_RANK`` (torchrun: every process sees every GPU of the node)."""
    if torch.cuda.device_count() == 1:
        return 0
    return int(os.environ.get("LOCAL_RANK", "0"))


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)  # a bare index names a CUDA device


class CudaToCpu(TorchFunctionMode):
    """Inside it, tensors asked for on a CUDA device are made on (or stay on) the CPU (see the module docstring)."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name == "cuda" and args and isinstance(args[0], torch.Tensor):
            return args[0]
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if name == "to" and args:
            args = tuple("cpu" if _is_cuda(a) else a for a in args)
        result = func(*args, **kwargs)
        if name == "type" and len(args) == 1 and not kwargs and isinstance(result, str):
            return result.replace("torch.", "torch.cuda.", 1)  # Megatron's clip_grads asserts CUDA floats
        return result


class _Scope(threading.local):
    active = False  # this thread is inside a CudaToCpu already (a strategy method calling another)


_SCOPE = _Scope()


def device_scope(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """:class:`CudaToCpu` on the CPU unless this thread is inside one already (nested modes would each rewrite what
    the inner one returns), nothing on CUDA."""
    if device.type != "cpu" or _SCOPE.active:
        return contextlib.nullcontext()
    return _entered()


@contextlib.contextmanager
def _entered() -> Iterator[None]:
    _SCOPE.active = True
    try:
        with CudaToCpu():
            yield
    finally:
        _SCOPE.active = False


def on_device(method: F) -> F:
    """Run a strategy method inside its :func:`device_scope` (the instance's ``device``)."""

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with device_scope(self.device):
            return method(self, *args, **kwargs)

    wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = (
        method.__name__,
        method.__qualname__,
        method.__doc__,
    )
    wrapper.__wrapped__ = method  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


_PATCHED = False


def install_cpu_patches() -> None:
    """Process-wide, once, and only where CUDA is unavailable (see the module docstring)."""
    global _PATCHED
    if _PATCHED or torch.cuda.is_available():
        return
    from megatron.core import tensor_parallel

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    # Reading a parameter's ``.grad`` through a TorchFunctionMode warns as if it were a non-leaf (Megatron's DDP
    # hooks read it every backward); only warnings raised from this module's own dispatch are silenced.
    warnings.filterwarnings(
        "ignore", message=r"The \.grad attribute of a Tensor that is not a leaf", module=__name__
    )
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    _PATCHED = True


def init_parallel(config: MegatronConfig, device: torch.device) -> None:
    """Join (or, alone, create) the world (NCCL on CUDA, gloo on CPU) and set up Megatron's TP/PP/DP groups once
    per process. A Ray role's workers join theirs first (``Worker.init_process_group``), so it is only joined here
    when the strategy runs alone or under torchrun."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        install_cpu_patches()
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
            )
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    if dist.get_world_size() % (tp * pp):
        raise ConfigError(f"world size {dist.get_world_size()} is not divisible by tp*pp = {tp}*{pp}")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
        )
    if device.type == "cuda":
        model_parallel_cuda_manual_seed(config.seed)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
