"""What both agentic pipelines run: the inference and env-worker clusters, and the rollout manager over them.

:class:`RolloutRuntime` is composed into a recipe (not inherited): the recipe passes its host's ``make_cluster``
so the clusters are placed on the run's reserved resources and shut down with it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.episode import Episode
from roll.agentic.env_manager.manager import Generation, Rollout, RolloutManager
from roll.agentic.env_manager.worker import (
    ClusterEnvPool,
    EnvWorker,
    pool_call_timeout_s,
    slots_per_worker,
    worker_kwargs,
)
from roll.agentic.pipeline.config import AgenticRunConfig
from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster
from roll.core.config.sampling import SamplingConfig
from roll.workers.config import SamplingParams
from roll.workers.roles.infer import ActorInferWorker
from roll.workers.roles.model import load_tokenizer
from roll.workers.roles.spec import GeneratorSpec

if TYPE_CHECKING:
    from roll.workers.roles.clusters import ActorInferCluster, GenerateCluster

logger = logging.getLogger(__name__)

MakeCluster = Callable[..., Cluster]


class ClusterGenerate:
    """A :class:`~roll.agentic.env_manager.manager.GenerateFn` on an ``ActorInferWorker`` cluster."""

    def __init__(self, infer: GenerateCluster, sampling: SamplingConfig, *, greedy: bool = False) -> None:
        self.infer = infer
        self.sampling = sampling
        self.greedy = greedy

    def __call__(
        self, prompts: list[list[int]], *, seed: int, vision: Mapping[str, list[Any]] | None = None
    ) -> list[Generation]:
        cfg = self.sampling
        params = SamplingParams(
            n=1,
            temperature=0.0 if self.greedy else cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            seed=seed % (2**62),
        )
        out = self.infer.generate(Batch(non_tensors={C.PROMPT_IDS: prompts, **(vision or {})}), params)
        ids, logps = out.non_tensors[C.RESPONSE_IDS], out.non_tensors[C.RESPONSE_LOGP]
        versions = (
            out.tensors[C.POLICY_VERSION].tolist() if C.POLICY_VERSION in out.tensors else [0] * len(ids)
        )
        return [
            Generation([int(t) for t in i], [float(v) for v in lp], int(version))
            for i, lp, version in zip(ids, logps, versions)
        ]


class RolloutRuntime:
    """Inference + env-worker clusters and a :class:`RolloutManager` for ``groups`` x ``group_size`` envs."""

    def __init__(
        self,
        config: AgenticRunConfig,
        make_cluster: MakeCluster,
        groups: int,
        group_size: int,
        infer: GenerateCluster | None = None,
    ) -> None:
        """``infer``: the policy's inference cluster when a policy group owns it; else one is made here."""
        self.config = config
        self.groups, self.group_size = groups, group_size
        self.tokenizer = load_tokenizer(config.policy_model, "actor_infer")
        self.encoder = ChatEncoder(
            self.tokenizer,
            _image_processor(config.policy_model.path),
            template_kwargs=config.env_manager.chat_template_kwargs,
        )
        self.owns_infer = infer is None
        self.infer = infer if infer is not None else self._infer_cluster(make_cluster)
        self.envs = self._env_cluster(make_cluster)
        generate = ClusterGenerate(self.infer, config.rollout)
        self.manager = RolloutManager(
            config.env_manager,
            self.envs,
            generate,
            self.encoder,
            max_new_tokens=config.rollout.max_new_tokens,
        )

    def _infer_cluster(self, make_cluster: MakeCluster) -> ActorInferCluster:
        cfg = self.config
        env = {"env_vars": {"OMP_NUM_THREADS": str(cfg.cpu_threads)}} if cfg.cpu_threads else None
        spec = GeneratorSpec(model=cfg.policy_model, strategy=cfg.actor_infer.strategy)
        cluster = make_cluster("actor_infer", ActorInferWorker, init_args=(spec,), runtime_env=env)
        return cast("ActorInferCluster", cluster)

    def _env_cluster(self, make_cluster: MakeCluster) -> ClusterEnvPool:
        em, workers = self.config.env_manager, self.config.env_workers.num_workers
        total = (self.groups + em.extra_groups) * self.group_size
        kwargs = worker_kwargs(em.envs, total, workers, em.step_timeout_s)
        cluster = make_cluster("env_workers", EnvWorker, init_kwargs=kwargs)
        return ClusterEnvPool(
            cluster, slots_per_worker(total, workers), call_timeout_s=pool_call_timeout_s(em.step_timeout_s)
        )

    def setup(self) -> None:
        if self.owns_infer:
            self.infer.setup()

    def rollout(self, batch_seed: int, *, greedy: bool = False, groups: int | None = None) -> Rollout:
        self.manager.generate = ClusterGenerate(self.infer, self.config.rollout, greedy=greedy)
        return self.manager.rollout(groups or self.groups, self.group_size, batch_seed=batch_seed)


def _image_processor(model_path: str) -> Any:
    """A vision-language policy's image processor (for image observations); None for a text policy."""
    from roll.data.models import is_vision_language, load_image_processor

    return load_image_processor(model_path) if is_vision_language(model_path) else None


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
    "ClusterGenerate",
    "RolloutRuntime",
    "dump_jsonl",
    "episode_record",
    "plot_success",
]
