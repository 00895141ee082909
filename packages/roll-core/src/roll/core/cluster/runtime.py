"""Starting or attaching to Ray, once per process.

:func:`init_ray` decides where Ray lives, in this order: ``RayConfig.address`` (``"local"`` forces a fresh local
instance), the ``RAY_ADDRESS`` environment variable, else a new local Ray sized by ``RayConfig.num_cpus`` (default:
``os.cpu_count()``). We pass ``address="local"`` for the last case on purpose: Ray's own ``address=None`` silently
attaches to whatever ``ray start`` cluster this machine ran last, which on a shared box is someone else's.

Token auth: Ray 2.60's ``ray.init()`` turns token authentication on for every new local cluster when
``RAY_AUTH_MODE`` is unset, writing a token to ``~/.ray/auth_token``. Once that file exists, every later process that
attaches to a local cluster with the variable unset also switches to token mode, and then fails against clusters
that were started without one (``ray.cluster_utils.Cluster``, a plain ``ray start``). A Ray that roll starts for
itself is private to this run, so when the user has not chosen a mode we set ``RAY_AUTH_MODE=disabled`` before the
start; child processes (raylet, GCS, workers) inherit it. A mode the user set is always respected.

OpenMP waits: a local Ray puts several torch workers (trainer, generator, reference, reward) on a few cores. With
OpenMP's default wait policy, each worker's idle threads spin between parallel regions and steal the cores the busy
worker needs: measured on 2 cores, quickstart GRPO steps took 8-14 s instead of 1.3-1.6 s. So a Ray that roll
starts itself gets ``OMP_WAIT_POLICY=PASSIVE`` (inherited like the auth mode) unless the user set a policy.

Memory: a local Ray starts without the dashboard's UI modules and without prestarted idle workers (Ray otherwise
starts one Python worker per CPU for tasks roll never submits: ~85 MB each); ``RayConfig.object_store_mb`` caps
the object store of a small run. It also starts without the autoscaler's monitor process (measured: 92 MB and
about 1.5 CPU-s of start-up on 2 cores): one local node never scales, and GCS, not the monitor, answers the
resource queries roll makes. ``ray.init`` has no argument for it, so the start asks Ray's own node parameters
(``RayParams.no_monitor``, what ``ray start --no-monitor`` sets) for the length of that one call; a Ray release
without that parameter starts with the monitor as before.

Triton: torch's CUDA wheels install Triton, and ``torch._dynamo`` imports it on load (transformers imports dynamo
for every model): 80 MB of resident memory in each torch worker (measured: tiny-1m loaded 823 MB with it, 744
without), for a compiler of GPU kernels a process without a GPU never runs. A local Ray with no GPU therefore gives
its workers a setup hook (Ray's ``worker_process_setup_hook``) that marks ``triton`` unimportable before any actor
code runs; torch then takes Triton for absent, and ``torch.compile`` on CPU (its C++ backend) is unaffected.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import ray

from roll.core.config.sections import RayConfig
from roll.core.errors import ResourceError

__all__ = ["RayHandle", "gpu_free_worker_setup", "init_ray", "shutdown_ray"]

_AUTH_ENV = "RAY_AUTH_MODE"
_OMP_WAIT_ENV = "OMP_WAIT_POLICY"
_ADDRESS_ENV = "RAY_ADDRESS"
_UV_HOOK_ENV = "RAY_ENABLE_UV_RUN_RUNTIME_ENV"
_log = logging.getLogger(__name__)
# How long to wait for a GCS port to accept a connection before giving up (capped by init_timeout_s): a head
# that is down should fail the run in seconds, with the fix, not after the minute-long init timeout.
_PROBE_BUDGET_S = 5.0

# True while a Ray that this process started is running; shutdown_ray leaves attached clusters alone.
_started_here = False


@dataclass(frozen=True)
class RayHandle:
    """The Ray this process uses.

    ``address`` is the GCS address (``host:port``); ``started_here`` says whether :func:`shutdown_ray` would stop
    it; ``call_timeout_s`` is the default timeout of remote calls from the config that made it.
    """

    address: str
    started_here: bool
    namespace: str
    call_timeout_s: float

    def shutdown(self) -> None:
        """Same as :func:`shutdown_ray`."""
        shutdown_ray()


def init_ray(cfg: RayConfig) -> RayHandle:
    """Attach to or start Ray as ``cfg`` says; a no-op returning the current handle if Ray is already up.

    Raises :class:`ResourceError` when the address cannot be reached within ``cfg.init_timeout_s`` or Ray fails
    to start, naming the address tried and how to fix it.
    """
    global _started_here
    if ray.is_initialized():
        return _handle(cfg, started_here=_started_here)
    address = _resolve_address(cfg)
    start = time.monotonic()
    if address is None:
        _start_local(cfg)
        _started_here = True
    else:
        _attach(cfg, address)
        _started_here = False
    _log.debug("ray ready in %.1fs (address=%s)", time.monotonic() - start, address or "local")
    return _handle(cfg, started_here=_started_here)


def shutdown_ray() -> None:
    """Stop Ray if this process started it; only disconnect when we merely attached to an existing cluster."""
    global _started_here
    if ray.is_initialized():
        ray.shutdown()
    _started_here = False


def _handle(cfg: RayConfig, *, started_here: bool) -> RayHandle:
    address = str(ray.get_runtime_context().gcs_address)
    return RayHandle(address, started_here, cfg.namespace, cfg.call_timeout_s)


def _resolve_address(cfg: RayConfig) -> str | None:
    """The address to attach to, or None to start a local Ray."""
    address = cfg.address or os.environ.get(_ADDRESS_ENV) or None
    if address == "local":
        return None
    return address


def _start_local(cfg: RayConfig) -> None:
    if _AUTH_ENV not in os.environ:
        os.environ[_AUTH_ENV] = "disabled"
    os.environ.setdefault(_OMP_WAIT_ENV, "PASSIVE")
    _disable_uv_run_hook()
    num_cpus = cfg.num_cpus if cfg.num_cpus is not None else float(os.cpu_count() or 1)
    gpu_free = (cfg.num_gpus if cfg.num_gpus is not None else _local_gpu_count()) == 0
    try:
        # ray.init wants whole CPUs; a fractional config rounds up so roles sized to it still fit.
        with _no_autoscaler_monitor():
            ray.init(
                address="local",
                num_cpus=max(1, int(-(-num_cpus // 1))),
                num_gpus=cfg.num_gpus,
                namespace=cfg.namespace,
                include_dashboard=False,
                object_store_memory=cfg.object_store_mb * 2**20 if cfg.object_store_mb else None,
                _system_config={"prestart_worker_first_driver": False, "enable_worker_prestart": False},
                runtime_env={"worker_process_setup_hook": _GPU_FREE_SETUP} if gpu_free else None,
                logging_level=logging.WARNING,
                log_to_driver=True,
            )
    except Exception as exc:
        raise ResourceError(
            f"could not start a local Ray: {type(exc).__name__}: {exc}\n"
            "hint: check free disk space under /tmp/ray and that no stale raylet holds the ports; "
            "or start Ray yourself (`ray start --head`) and set RAY_ADDRESS / ray.address to it",
            address="local",
        ) from exc


_GPU_FREE_SETUP = f"{__name__}.gpu_free_worker_setup"


def gpu_free_worker_setup() -> None:
    """The setup hook of every worker of a local Ray without GPUs: Triton is unimportable there (see the module
    docstring). A process that already imported it keeps it."""
    if "triton" not in sys.modules:
        sys.modules["triton"] = None  # type: ignore[assignment]  # Python's documented way to block an import


def _local_gpu_count() -> int:
    """The GPUs a local Ray would detect on this node (Ray's own detection); when that fails, -1 (unknown)."""
    try:
        from ray._private.accelerators import get_accelerator_manager_for_resource

        manager = get_accelerator_manager_for_resource("GPU")
        return int(manager.get_current_node_num_accelerators()) if manager is not None else 0
    except Exception:  # a private API: a Ray release that moved it only loses the saving
        _log.debug("could not count this node's GPUs", exc_info=True)
        return -1


@contextmanager
def _no_autoscaler_monitor() -> Iterator[None]:
    """While a local head starts, build Ray's node parameters with ``no_monitor=True`` (see the module docstring)."""
    from ray._private import parameter

    original = getattr(parameter, "RayParams", None)
    if original is None or "no_monitor" not in inspect.signature(original).parameters:
        yield
        return

    class _NoMonitor(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs.setdefault("no_monitor", True)
            super().__init__(*args, **kwargs)

    setattr(parameter, "RayParams", _NoMonitor)  # noqa: B010 (a module attribute mypy takes for a type)
    try:
        yield
    finally:
        setattr(parameter, "RayParams", original)  # noqa: B010


def _disable_uv_run_hook() -> None:
    """Run workers with this interpreter instead of Ray's ``uv run`` replay, unless the user chose otherwise.

    When the driver runs under ``uv run``, Ray (``RAY_ENABLE_UV_RUN_RUNTIME_ENV``, on by default) uploads the
    current directory as every job's ``working_dir`` and starts each worker with ``uv run``, which builds a
    second environment from the uploaded copy: measured here, ~20 s more per cluster start, and workers that run
    a snapshot rather than the installed packages. roll's packages are installed in the driver's environment
    (the same path on every node of a cluster), so workers use that. Ray reads the flag from its constants module
    when ``ray.init`` runs, so setting the environment variable after ``import ray`` is not enough.
    """
    if _UV_HOOK_ENV in os.environ:
        return
    os.environ[_UV_HOOK_ENV] = "0"
    from ray._private import ray_constants

    ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False


def _attach(cfg: RayConfig, address: str) -> None:
    """Connect to an existing cluster, probing the GCS port first so a dead address fails fast, not by hanging."""
    source = "ray.address" if cfg.address else "RAY_ADDRESS"
    if address != "auto" and "://" not in address:
        _probe(address, min(cfg.init_timeout_s, _PROBE_BUDGET_S), source)
    _disable_uv_run_hook()
    try:
        ray.init(address=address, namespace=cfg.namespace, logging_level=logging.WARNING)
    except Exception as exc:
        raise ResourceError(
            _attach_message(address, source, f"{type(exc).__name__}: {exc}"), address=address
        ) from exc


def _probe(address: str, timeout_s: float, source: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ResourceError(
            _attach_message(address, source, "it is not of the form host:port"), address=address
        )
    deadline = time.monotonic() + timeout_s
    last_error = "no attempt made"
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=min(2.0, timeout_s)):
                return
        except socket.gaierror as exc:  # an unknown host name does not start resolving a second later
            reason = f"the host name does not resolve ({exc})"
            raise ResourceError(_attach_message(address, source, reason), address=address) from None
        except OSError as exc:
            last_error = f"{type(exc).__name__}: {exc}"
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    reason = f"nothing answered within {timeout_s:g}s ({last_error})"
    raise ResourceError(_attach_message(address, source, reason), address=address)


def _attach_message(address: str, source: str, reason: str) -> str:
    return (
        f"could not attach to Ray at {address!r} (from {source}): {reason}\n"
        "hint: start a cluster there (`ray start --head --port=6379`), fix the address, "
        f"or unset {source} (RAY_ADDRESS / ray.address) so roll starts a local Ray"
    )
