"""Shared bits of the worker-role tests: a picklable SFT loss, tiny batches, role configs, and
:class:`ClusterSet`, which starts clusters in background threads so their actor starts overlap."""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import ray
import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster, Worker
from roll.core.config.sections import RoleConfig
from roll.workers.config import FSDP2Config, HFInferConfig, OptimizerConfig
from roll.workers.roles import ModelConfig
from roll.workers.types import ForwardOutput, LossDefaults, MicroBatch

# Ray workers cannot import the tests folder: ship this module's classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

MODEL = ModelConfig(path="tiny-1m")
OPTIM = OptimizerConfig(lr=1e-2, eps=1e-3)
"""``eps=1e-3``, as in test_fsdp2: Adam's first steps are ~``lr * sign(g)`` with a tiny eps, so gradients that
differ by summation order (1e-8) on parameters with ~0 true gradient would move by ``lr``; eps=1e-3 makes the
update Lipschitz in ``g`` and equal gradients give parameters equal to ~1e-7."""


def fsdp2(**kw: object) -> FSDP2Config:
    return FSDP2Config.model_validate({"device": "cpu", "optimizer": OPTIM, **kw})


def hf_infer() -> HFInferConfig:
    return HFInferConfig(device="cpu")


class TokenSumNLL(LossDefaults):
    """SFT loss: summed NLL over ``response_mask_BT`` tokens; the units are those tokens."""

    def __call__(
        self, output: ForwardOutput, micro_batch: MicroBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        nll_sum = -(output.logp_BT * micro_batch[C.RESPONSE_MASK]).sum()
        return nll_sum, {"nll": float(nll_sum) / self.count_units(micro_batch)}

    def count_units(self, micro_batch: MicroBatch) -> float:
        return float(micro_batch[C.RESPONSE_MASK].sum())


def sequences(rows: int = 8, T: int = 12, seed: int = 0, vocab: int = 500) -> Batch:
    """Right-padded rows of lengths 5..T, the loss on every token after the first 3 (the "prompt")."""
    g = torch.Generator().manual_seed(seed)
    lengths_B = torch.randint(5, T + 1, (rows,), generator=g)
    mask_BT = (torch.arange(T)[None, :] < lengths_B[:, None]).long()
    ids_BT = torch.randint(3, vocab, (rows, T), generator=g) * mask_BT
    resp_BT = mask_BT.clone()
    resp_BT[:, :3] = 0
    return Batch(
        {
            C.INPUT_IDS: ids_BT,
            C.ATTENTION_MASK: mask_BT,
            C.RESPONSE_MASK: resp_BT,
            C.SAMPLE_ID: torch.arange(rows),
        }
    )


@dataclass(frozen=True)
class Spec:
    """How to build one cluster: ``Cluster(role, worker_cls, role_cfg, init_kwargs=...)``, then ``setup()``."""

    role: str
    worker_cls: type[Worker]
    role_cfg: RoleConfig
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    setup: bool = True


def _build(spec: Spec) -> Cluster:
    cluster = Cluster(spec.role, spec.worker_cls, spec.role_cfg, init_kwargs=dict(spec.init_kwargs))
    try:
        if spec.setup:
            cluster.setup()
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


class ClusterSet:
    """Clusters built and set up in background threads from :meth:`start` on; :meth:`get` waits for them.

    ``Cluster(...)`` blocks until its actors are up (~15 s each here, mostly importing torch), so building the
    clusters of a test module one after another serialises those starts; building them in threads overlaps them,
    and a module can start its own clusters while shared ones are still coming up.
    """

    def __init__(self, specs: Mapping[str, Spec]) -> None:
        self.specs = dict(specs)
        self._lock = threading.Lock()
        self._futures: dict[str, Future[Cluster]] = {}

    def start(self) -> ClusterSet:
        """Begin building every cluster (no-op when already started)."""
        with self._lock:
            if not self._futures:
                pool = ThreadPoolExecutor(max_workers=len(self.specs), thread_name_prefix="cluster-start")
                self._futures = {name: pool.submit(_build, spec) for name, spec in self.specs.items()}
                pool.shutdown(wait=False)
        return self

    def get(self) -> dict[str, Cluster]:
        """Every cluster, built and set up (starts them first if needed)."""
        return {name: future.result() for name, future in self.start()._futures.items()}

    def shutdown(self) -> None:
        """Kill every cluster built so far (waits for the ones still starting). Safe to call twice."""
        with self._lock:
            futures, self._futures = self._futures, {}
        for future in futures.values():
            if future.exception() is None:
                future.result().shutdown()
