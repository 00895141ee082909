"""What a part borrows from the run that holds its recipe: :class:`PipelineHost`.

A part that starts clusters of its own (a teacher's SFT warm-up, an advantage transform's teachers) needs four
things of the run and no more: to make a cluster on the resources reserved for a role (and to hand one back
before the run ends, so its bundles go to the next role), to log metrics, the run's seed and its output folder.
It is a narrower view of the recipe's :class:`~roll.core.run.RunHost` (no samples, failure guard or step), so the
part cannot reach into the run or the recipe it serves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from roll.core.cluster import Cluster
from roll.core.run import RunHost


@dataclass(frozen=True)
class PipelineHost:
    """``make_cluster(role, worker_cls, **kwargs)``: :meth:`~roll.core.run.RunHost.make_cluster`;
    ``release_cluster(cluster)``: forget a cluster the part has shut down itself; ``log(metrics, step)``: the run's
    tracker; ``seed``: the run's seed; ``output_dir``: the run's folder."""

    make_cluster: Callable[..., Cluster]
    release_cluster: Callable[[Cluster], None]
    log: Callable[[Mapping[str, float], int], None]
    seed: int
    output_dir: Path

    @classmethod
    def of(cls, host: RunHost) -> PipelineHost:
        """The part's view of a recipe's ``host``; the run's clusters and tracker are looked up at each call, as
        a restart replaces the clusters."""
        return cls(
            make_cluster=host.make_cluster,
            release_cluster=host.release_cluster,
            log=lambda metrics, step: host.tracker.log(metrics, step),
            seed=host.seed,
            output_dir=host.output_dir,
        )
