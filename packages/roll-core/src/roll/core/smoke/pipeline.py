"""Implementation of the smoke pipeline (see the package docstring)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from roll.core.batch import PAD_COLUMN, Batch
from roll.core.checkpoint import require_finite
from roll.core.cluster import Cluster, Dispatch, Worker, WorkerContext, register
from roll.core.cluster.cluster import on_cluster
from roll.core.config.sections import RoleConfig
from roll.core.run import RunHost
from roll.core.smoke import SmokeConfig
from roll.core.tracking import reduce_metrics
from roll.core.types import Phases

WEIGHTS_FILE = "linear.pt"


class RegressionWorker(Worker):
    """One data-parallel rank: a linear model whose gradients are averaged over all ranks' samples."""

    def __init__(self, ctx: WorkerContext, features: int, lr: float, seed: int) -> None:
        super().__init__(ctx)
        torch.manual_seed(seed)  # the same init on every rank
        self.model = torch.nn.Linear(features, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)

    @register(Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        self.init_process_group(backend="gloo")

    @register(Dispatch.DP_SPLIT)
    def train_step(self, batch: Batch) -> list[dict[str, float]]:
        x_BF, y_B = batch.tensors["x_BF"], batch.tensors["y_B"]
        pad_B = batch.tensors.get(PAD_COLUMN)
        weight_B = (~pad_B).float() if pad_B is not None else torch.ones_like(y_B)
        global_count = float(batch.meta["global_count"])
        self.optimizer.zero_grad()
        err_B = self.model(x_BF).squeeze(-1) - y_B
        loss_sum = (weight_B * err_B.pow(2)).sum()
        (loss_sum / global_count).backward()
        for p in self.model.parameters():  # sum of per-rank shares = the mean over the global batch
            torch.distributed.all_reduce(p.grad)  # type: ignore[arg-type]
        self.optimizer.step()
        return [
            {"loss": loss_sum.item() / max(weight_B.sum().item(), 1.0), "samples/sum": weight_B.sum().item()}
        ]

    @register(Dispatch.RANK_ZERO)
    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    @register(Dispatch.ONE_TO_ALL)
    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.model.load_state_dict(dict(state))


class RegressionCluster(Cluster):
    """The driver's typed view of a :class:`RegressionWorker` cluster (a type: never built, see ``on_cluster``)."""

    setup = on_cluster(RegressionWorker.setup)
    train_step = on_cluster(RegressionWorker.train_step)
    state_dict = on_cluster(RegressionWorker.state_dict)
    load_state_dict = on_cluster(RegressionWorker.load_state_dict)


class SmokeRecipe:
    """Fits ``y = x·w* + noise``; the loss must fall towards ``noise²``. Phases: ``evaluate``."""

    def __init__(self, config: SmokeConfig, host: RunHost) -> None:
        self.config = config
        self.host = host
        rng = np.random.default_rng(config.seed)
        self.true_w_F = rng.normal(size=config.features).astype(np.float32)

    def phases(self) -> Phases:
        return Phases(evaluate=self.evaluate)

    def roles(self) -> Mapping[str, RoleConfig]:
        return {"workers": self.config.workers}

    def setup(self) -> None:
        cfg = self.config
        cluster = self.host.make_cluster(
            "workers", RegressionWorker, init_args=(cfg.features, cfg.lr, cfg.seed)
        )
        self.workers = cast(RegressionCluster, cluster)
        self.workers.setup()

    def train_step(self, step: int) -> Mapping[str, float]:
        batch = self._batch(step)
        per_rank = self.workers.train_step(batch)
        return reduce_metrics(per_rank)

    def evaluate(self, step: int) -> Mapping[str, float]:
        state = self.workers.state_dict()
        w = state["weight"].squeeze(0).numpy()
        return {"weight_error": float(np.abs(w - self.true_w_F).max())}

    def _batch(self, step: int) -> Batch:
        """Deterministic in (seed, step): a resumed run sees exactly the batches it would have seen."""
        n = self.config.batch.samples_per_step
        rng = np.random.default_rng([self.config.seed, step])
        x = rng.normal(size=(n, self.config.features)).astype(np.float32)
        y = x @ self.true_w_F + self.config.noise * rng.normal(size=n).astype(np.float32)
        return Batch({"x_BF": torch.from_numpy(x), "y_B": torch.from_numpy(y)}, meta={"global_count": n})

    def save_files(self, directory: Path) -> None:
        state = self.workers.state_dict()
        require_finite(state, "the smoke model's weights")
        torch.save(state, directory / WEIGHTS_FILE)

    def load_files(self, directory: Path) -> None:
        self.workers.load_state_dict(torch.load(directory / WEIGHTS_FILE, weights_only=True))

    def state(self) -> Mapping[str, Any]:
        return {"next_step": self.host.step}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore: a step's batch depends on (seed, step) alone."""
