"""RewardScheduler: score rollouts on reward-worker clusters, one cluster per domain, routed by each row's tag.

Rows carry a tag (``"math"``, ``"code"``, ``"arithmetic"``...); ``routes`` maps tags to domains and each domain
has its own :class:`~roll.core.cluster.Cluster` of reward workers, whose registered ``method`` takes a
:class:`~roll.core.batch.Batch` of rows and returns a Batch of the same rows with score columns. A job is
submitted without waiting (:meth:`RewardScheduler.submit`), so scoring one request's samples overlaps with the
generation of the next; each domain's rows are spread over its ranks, and the small jobs of request-level
scheduling rotate over ranks so one slow verifier does not hold every job. :meth:`RewardJob.result` puts the
returned columns back next to the input rows, in the input order.

Generic over what the rows and the scores are: nothing here knows about rewards beyond "a tag column".
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import ray
import torch

from roll.core.batch import Batch
from roll.core.cluster import Cluster
from roll.core.errors import DataError
from roll.core.scheduler.rank_calls import RankCall, submit_to_rank

__all__ = ["RewardJob", "RewardScheduler"]


class RewardJob:
    """Scoring of one batch in flight. ``refs`` lets a scheduler wait on it together with other calls."""

    def __init__(self, batch: Batch, parts: list[tuple[np.ndarray, RankCall]]) -> None:
        self.batch = batch
        self.parts = parts
        self.submitted_at = time.perf_counter()

    @property
    def refs(self) -> list[ray.ObjectRef[Any]]:
        return [call.ref for _, call in self.parts]

    def done(self) -> bool:
        return all(call.pending.done() for _, call in self.parts)

    def result(self) -> Batch:
        """The input rows with the workers' columns added (input order). Raises the first worker failure."""
        if not self.parts:
            return self.batch
        scored = [call.pending.result() for _, call in self.parts]
        index_B = np.concatenate([rows for rows, _ in self.parts])
        joined = Batch.concat(scored)
        if len(joined) != len(index_B):
            raise DataError(f"reward workers returned {len(joined)} rows for {len(index_B)} rows sent")
        order_B = torch.from_numpy(np.argsort(index_B, kind="stable"))
        columns = joined.select(order_B)
        overlap = [name for name in columns if name in self.batch]
        if overlap:  # columns the workers echoed back: the input's copy is kept
            columns.pop(*overlap)
        return self.batch.union(columns)


class RewardScheduler:
    """Routes rows by ``tag_column`` to domain clusters and scores them there (see the module docstring).

    ``routes`` maps a tag to a domain name (a key of ``domains``); a tag that maps nowhere goes to
    ``default_domain`` when one is given, else submitting raises :class:`DataError` naming the tag. With a
    single domain, an untagged row (tag ``""``) goes to it: there is nothing to choose.
    """

    def __init__(
        self,
        domains: Mapping[str, Cluster],
        routes: Mapping[str, str],
        *,
        method: str = "score",
        tag_column: str = "tag",
        default_domain: str | None = None,
    ) -> None:
        unknown = sorted({d for d in routes.values() if d not in domains})
        if unknown or (default_domain is not None and default_domain not in domains):
            raise DataError(
                f"reward routes name unknown domains {unknown or [default_domain]}; known: {sorted(domains)}"
            )
        self.domains = dict(domains)
        self.routes = dict(routes)
        self.method = method
        self.tag_column = tag_column
        self.default_domain = default_domain
        self._next_rank = {name: itertools.cycle(range(c.world_size)) for name, c in self.domains.items()}

    def domain_of(self, tag: str) -> str:
        """The domain that scores rows tagged ``tag``."""
        domain = self.routes.get(tag, self.default_domain)
        if domain is None and not tag and len(self.domains) == 1:
            domain = next(iter(self.domains))
        if domain is None:
            raise DataError(
                f"no reward domain for tag {tag!r}; routes: {self.routes}. Add the tag to a domain's `tags`"
            )
        return domain

    def submit(self, batch: Batch) -> RewardJob:
        """Start scoring ``batch``; returns at once."""
        tags = batch[self.tag_column]
        domain_B = np.array([self.domain_of(str(tag)) for tag in tags], dtype=object)
        parts: list[tuple[np.ndarray, RankCall]] = []
        for domain in dict.fromkeys(domain_B.tolist()):
            rows = np.flatnonzero(domain_B == domain)
            parts += self._submit_domain(domain, batch, rows)
        return RewardJob(batch, parts)

    def score(self, batch: Batch) -> Batch:
        """Submit and wait: the input rows with the score columns added."""
        return self.submit(batch).result()

    def _submit_domain(
        self, domain: str, batch: Batch, rows: np.ndarray
    ) -> list[tuple[np.ndarray, RankCall]]:
        cluster = self.domains[domain]
        shares = [s for s in np.array_split(rows, min(cluster.world_size, len(rows))) if len(s)]
        parts = []
        for share in shares:
            rank = next(self._next_rank[domain])
            sub = batch.select(torch.from_numpy(share))
            parts.append((share, submit_to_rank(cluster, rank, self.method, sub)))
        return parts
