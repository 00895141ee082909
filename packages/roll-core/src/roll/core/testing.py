"""roll's pytest plugin: one shared local Ray per test run, the ``gpu`` and ``slow`` markers, tiny role configs.

Load it with ``pytest_plugins = ["roll.core.testing"]`` in the top ``conftest.py``.

- ``ray_local`` (session fixture): starts one local Ray (4 logical CPUs, so several small actors fit on a 2-core
  box; no dashboard) on first use and stops it at the end of the run. Ray starting costs ~8 s, which is why it is
  shared. It always starts a fresh local instance, ignoring ``RAY_ADDRESS``, so tests never touch a real cluster.
- ``@pytest.mark.gpu``: skipped, with the reason, when ``torch.cuda.is_available()`` is false. torch is imported
  only if some collected test carries the marker.
- ``@pytest.mark.slow``: only a label; slow tests still run unless deselected with ``-m "not slow"``.
- :func:`tiny_role`: a :class:`RoleConfig` sized for tests (one worker, 0.25 CPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from roll.core.config.sections import RayConfig, RoleConfig

__all__ = ["TEST_NUM_CPUS", "ray_local", "tiny_role"]

TEST_NUM_CPUS = 4.0


def tiny_role(**overrides: Any) -> RoleConfig:
    """A RoleConfig for tests: 1 worker, 0.25 CPU, no GPU, unless ``overrides`` say otherwise."""
    fields: dict[str, Any] = {"num_workers": 1, "cpus_per_worker": 0.25, "gpus_per_worker": 0.0}
    fields.update(overrides)
    return RoleConfig(**fields)


@pytest.fixture(scope="session")
def ray_local() -> Iterator[Any]:
    """The session's local Ray, as a :class:`~roll.core.cluster.runtime.RayHandle`."""
    from roll.core.cluster.runtime import init_ray, shutdown_ray

    handle = init_ray(RayConfig(address="local", num_cpus=TEST_NUM_CPUS, call_timeout_s=60.0))
    try:
        yield handle
    finally:
        if handle.started_here:
            shutdown_ray()


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too, so a package's tests run with --strict-markers without the root pytest settings.
    config.addinivalue_line("markers", "gpu: needs CUDA; skipped cleanly without it")
    config.addinivalue_line("markers", "slow: takes more than a few seconds; still runs in CI")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = _cuda_missing_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)


def _cuda_missing_reason() -> str | None:
    """None when CUDA is usable, else why the ``gpu`` tests are skipped."""
    try:
        import torch
    except ImportError:
        return "gpu test: torch is not installed"
    if not torch.cuda.is_available():
        return "gpu test: torch.cuda.is_available() is False (no CUDA device or a CPU-only torch)"
    return None
