"""What a part borrows from the pipeline that runs it: :class:`PipelineHost`.

A part that starts clusters of its own (a teacher's SFT warm-up, an advantage transform's teachers) needs four
things of its pipeline and no more: to make a cluster on the resources reserved for a role (and to hand one back
before the run ends, so its bundles go to the next role), to log metrics, the run's seed and its output folder.
Handing it these instead of the pipeline keeps the part from reaching into a pipeline class it does not own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from roll.core.cluster import Cluster
from roll.core.pipeline import BasePipeline


@dataclass(frozen=True)
class PipelineHost:
    """``make_cluster(role, worker_cls, **kwargs)``: :meth:`~roll.core.pipeline.BasePipeline.make_cluster`;
    ``release_cluster(cluster)``: forget a cluster the part has shut down itself; ``log(metrics, step)``: the run's
    tracker; ``seed``: the run's seed; ``output_dir``: the run's folder."""

    make_cluster: Callable[..., Cluster]
    release_cluster: Callable[[Cluster], None]
    log: Callable[[Mapping[str, float], int], None]
    seed: int
    output_dir: Path

    @classmethod
    def of(cls, pipeline: BasePipeline) -> PipelineHost:
        """The host view of ``pipeline``; its clusters and tracker are looked up at each call, as the pipeline
        replaces them on a restart."""
        return cls(
            make_cluster=pipeline.make_cluster,
            release_cluster=lambda cluster: pipeline.clusters.remove(cluster),
            log=lambda metrics, step: pipeline.tracker.log(metrics, step),
            seed=pipeline.config.seed,
            output_dir=pipeline.output_dir,
        )
