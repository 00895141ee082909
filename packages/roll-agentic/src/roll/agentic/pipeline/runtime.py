"""What both agentic pipelines run: the inference and env-worker clusters, and the rollout manager over them.

:class:`RolloutRuntime` is composed into a pipeline (not inherited): the pipeline passes its ``make_cluster`` so
the clusters are placed on its reserved resources and shut down with it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.config import EnvManagerConfig
from roll.agentic.env_manager.episode import Episode
from roll.agentic.env_manager.manager import Generation, Rollout, RolloutManager
from roll.agentic.env_manager.worker import ClusterEnvPool, EnvWorker, slots_per_worker, worker_kwargs
from roll.agentic.pipeline.config import AgenticRunConfig
from roll.core import columns as C
from roll.core import plugins
from roll.core.batch import Batch
from roll.core.cluster import Cluster
from roll.workers.config import SamplingParams
from roll.workers.roles.actor import ActorTrainWorker
from roll.workers.roles.infer import ActorInferWorker
from roll.workers.roles.model import load_tokenizer

logger = logging.getLogger(__name__)

MakeCluster = Callable[..., Cluster]


AgenticActorWorker = (
    ActorTrainWorker  # train_step (loss metrics as actor/*), set_lr and threads live on the base role
)


class ClusterGenerate:
    """A :class:`~roll.agentic.env_manager.manager.GenerateFn` on an ``ActorInferWorker`` cluster."""

    def __init__(self, infer: Cluster, config: EnvManagerConfig, *, greedy: bool = False) -> None:
        self.infer = infer
        self.config = config
        self.greedy = greedy

    def __call__(self, prompts: list[list[int]], *, seed: int) -> list[Generation]:
        cfg = self.config
        params = SamplingParams(
            n=1,
            temperature=0.0 if self.greedy else cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            seed=seed % (2**62),
        )
        out = self.infer.generate(Batch(non_tensors={C.PROMPT_IDS: prompts}), params)
        ids, logps = out.non_tensors[C.RESPONSE_IDS], out.non_tensors[C.RESPONSE_LOGP]
        return [Generation([int(t) for t in i], [float(v) for v in lp]) for i, lp in zip(ids, logps)]


class RolloutRuntime:
    """Inference + env-worker clusters and a :class:`RolloutManager` for ``groups`` x ``group_size`` envs."""

    def __init__(
        self, config: AgenticRunConfig, make_cluster: MakeCluster, groups: int, group_size: int
    ) -> None:
        self.config = config
        self.groups, self.group_size = groups, group_size
        self.tokenizer = load_tokenizer(config.model, "actor_infer")
        self.encoder = ChatEncoder(self.tokenizer)
        env = {"env_vars": {"OMP_NUM_THREADS": str(config.cpu_threads)}} if config.cpu_threads else None
        infer_args = (config.model, self._infer_config(), config.infer_strategy)
        self.infer = make_cluster("actor_infer", ActorInferWorker, init_args=infer_args, runtime_env=env)
        self.envs = self._env_cluster(make_cluster)
        self.manager = RolloutManager(
            config.env_manager, self.envs, ClusterGenerate(self.infer, config.env_manager), self.encoder
        )

    def _infer_config(self) -> Any:
        spec = plugins.load("roll.strategy", self.config.infer_strategy)
        return spec.config_model.model_validate(self.config.infer)

    def _env_cluster(self, make_cluster: MakeCluster) -> ClusterEnvPool:
        em, workers = self.config.env_manager, self.config.env_workers.num_workers
        total = (self.groups + em.extra_groups) * self.group_size
        kwargs = worker_kwargs(em.envs, total, workers, em.step_timeout_s)
        cluster = make_cluster("env_workers", EnvWorker, init_kwargs=kwargs)
        return ClusterEnvPool(cluster, slots_per_worker(total, workers))

    def setup(self) -> None:
        self.infer.setup()

    def rollout(self, batch_seed: int, *, greedy: bool = False, groups: int | None = None) -> Rollout:
        self.manager.generate = ClusterGenerate(self.infer, self.config.env_manager, greedy=greedy)
        return self.manager.rollout(groups or self.groups, self.group_size, batch_seed=batch_seed)


def episode_record(episode: Episode, step: int) -> dict[str, Any]:
    """A JSON-able record of an episode for trajectory dumps."""
    return {
        "step": step,
        C.TAG: episode.tag,
        "group": episode.group,
        "seed": episode.seed,
        "status": episode.status,
        "success": episode.success,
        "return": episode.total_reward,
        "system": episode.system,
        "turns": [
            {
                "observation": t.observation,
                "response": t.text,
                "action": t.action,
                "format_ok": t.format_ok,
                "reward": t.reward,
            }
            for t in episode.turns
        ],
    }


def dump_jsonl(path: Path, episodes: Sequence[Episode], step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for e in episodes:
            f.write(json.dumps(episode_record(e, step)) + "\n")


def plot_success(output_dir: Path, keys: Sequence[str] = ("env/success_rate",)) -> Path | None:
    """``plot.png``: the given metrics per step from ``metrics.jsonl`` (None without matplotlib or data)."""
    path = output_dir / "metrics.jsonl"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )
    rows = [{**r, **r["metrics"]} if isinstance(r.get("metrics"), dict) else r for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key in keys:
        pts = [(r["step"], r[key]) for r in rows if key in r and "step" in r]
        if pts:
            ax.plot(*zip(*pts), marker=".", label=key)
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    out = output_dir / "plot.png"
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


__all__ = [
    "AgenticActorWorker",
    "ClusterGenerate",
    "RolloutRuntime",
    "dump_jsonl",
    "episode_record",
    "plot_success",
]
