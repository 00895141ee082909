"""RewardScheduler: score rollouts on reward-worker clusters, one cluster per domain, routed by each row's tag.

Rows carry a tag (``"math"``, ``"code"``, ``"arithmetic"``...); ``routes`` maps tags to domains and each domain
has its own :class:`~roll.core.cluster.Cluster` of reward workers, given as a
:class:`~roll.core.scheduler.rank_calls.RankRequest` of the method that scores
(``RankRequest.bind(cast("RewardCluster", cluster).score)``): it takes a :class:`~roll.core.batch.Batch` of rows
and returns a Batch of the same rows with score columns. A job is
submitted without waiting (:meth:`RewardScheduler.submit`), so scoring one request's samples overlaps with the
generation of the next; each domain's rows are spread over its ranks, and the small jobs of request-level
scheduling rotate over ranks so one slow verifier does not hold every job. :meth:`RewardJob.result` puts the
returned columns back next to the input rows, in the input order.

Light workers: with ``columns`` set, a worker gets plain ``{name: [value per row]}`` (:data:`ColumnRows`) of those
columns instead of a Batch (the type checker holds the domains' methods to what they will get), and may answer ``{name: [value per row]}``: columns whose name ends in axes (``scores_B``) become
float32 tensor columns here, the others (``reward_error_report``) stay per-row Python values. Unpickling a Batch
costs little more (its columns stay numpy in a process without torch, see :mod:`roll.core.batch`), but plain
lists keep a worker's code free of the container.

Deadlines: each share of rows sent to a rank must be answered within the reward role's call timeout
(``RoleConfig.call_timeout_s``, else ``ray.call_timeout_s``; the role's ``@register(timeout_s=...)`` wins). A share
still running then is abandoned: its rank is restarted (a hung verifier cannot be interrupted from outside its
process, and every later call queued on that actor would wait behind it) and, with ``on_timeout`` set, its rows
get the columns ``on_timeout(domain, n, reason)`` returns (the reward pipelines mark them failed, ``reward_error_B`` 1,
with the reason) and the step goes on; without it the :class:`~roll.core.errors.WorkerTimeoutError` is raised. A
job counts as :meth:`~RewardJob.ready` when every share has answered *or* passed its deadline, so a scheduler
that waits on ``refs`` bounded by :attr:`~RewardJob.deadline` reads the verdict on time.

Generic over what the rows and the scores are: nothing here knows about rewards beyond "a tag column".
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import ray

from roll.core import columns as C
from roll.core.batch import Batch, as_column
from roll.core.errors import DataError, WorkerError, WorkerTimeoutError
from roll.core.scheduler.rank_calls import RankCall, RankRequest

__all__ = ["ColumnRows", "FailedRows", "RewardJob", "RewardScheduler"]

ColumnRows = dict[str, list[Any]]
"""What a light reward worker gets with ``RewardScheduler(columns=...)``: ``{name: [value per row]}``."""

FailedRows = Callable[[str, int, str], Mapping[str, list[Any]]]
"""``on_timeout(domain, n, reason)``: the score columns (``{name: [value per row]}``, as a light worker answers) of
``n`` rows of ``domain`` whose reward call was abandoned; ``reason`` says which role, rank and deadline."""

log = logging.getLogger(__name__)


@dataclass
class _Part:
    """One rank's share of a job: which input rows, on which domain, and the call in flight."""

    rows: np.ndarray
    domain: str
    call: RankCall
    epoch: int = 0  # how many times the rank had been restarted when the call went out


class RewardJob:
    """Scoring of one batch in flight. ``refs`` lets a scheduler wait on it together with other calls."""

    def __init__(self, scheduler: RewardScheduler, batch: Batch, parts: list[_Part]) -> None:
        self.scheduler = scheduler
        self.batch = batch
        self.parts = parts
        self.submitted_at = time.perf_counter()

    @property
    def refs(self) -> list[ray.ObjectRef[Any]]:
        return [part.call.ref for part in self.parts]

    def done(self) -> bool:
        return all(part.call.pending.done() for part in self.parts)

    @property
    def deadline(self) -> float:
        """The earliest deadline (``time.monotonic()``) of the shares still in flight; ``inf`` when none."""
        return min((p.call.deadline for p in self.parts if not p.call.pending.done()), default=float("inf"))

    def ready(self) -> bool:
        """True when :meth:`result` will not wait on a live call: every share answered or is past its deadline."""
        now = time.monotonic()
        return all(part.call.expired(now) or part.call.pending.done() for part in self.parts)

    def result(self) -> Batch:
        """The input rows with the workers' columns added (input order). A part whose worker died is retried on
        a restarted worker (see :class:`RewardScheduler`); any other failure is raised."""
        if not self.parts:
            return self.batch
        scored = [self.scheduler._collect(self.batch, part) for part in self.parts]
        index_B = np.concatenate([part.rows for part in self.parts])
        joined = Batch.concat(scored)
        if len(joined) != len(index_B):
            raise DataError(f"reward workers returned {len(joined)} rows for {len(index_B)} rows sent")
        order_B = np.argsort(index_B, kind="stable")
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

    A reward worker whose process dies (a verifier that segfaults, an OOM kill) is restarted in place
    (:meth:`Cluster.restart_rank`) and its share of the rows is sent again, at most ``max_retries`` times per
    share; ``retried_requests`` counts the rows sent again, and each retry is logged with role, rank and cause.
    A share past its deadline is abandoned (module docstring): ``timed_out_rows`` counts its rows, and the
    warning names role, rank, rows and deadline. A share that was queued on a rank restarted under it (another
    share's timeout) never ran on a live worker, so it is sent again instead.
    """

    @overload
    def __init__(
        self,
        domains: Mapping[str, RankRequest[Batch]],
        routes: Mapping[str, str],
        *,
        tag_column: str = ...,
        default_domain: str | None = ...,
        max_retries: int = ...,
        columns: None = ...,
        on_timeout: FailedRows | None = ...,
    ) -> None: ...
    @overload
    def __init__(
        self,
        domains: Mapping[str, RankRequest[ColumnRows]],
        routes: Mapping[str, str],
        *,
        tag_column: str = ...,
        default_domain: str | None = ...,
        max_retries: int = ...,
        columns: tuple[str, ...],
        on_timeout: FailedRows | None = ...,
    ) -> None: ...
    def __init__(
        self,
        domains: Mapping[str, RankRequest[Any]],
        routes: Mapping[str, str],
        *,
        tag_column: str = C.TAG,
        default_domain: str | None = None,
        max_retries: int = 2,
        columns: tuple[str, ...] | None = None,
        on_timeout: FailedRows | None = None,
    ) -> None:
        """``domains``: each domain's scoring method, rows unbound (a Batch; :data:`ColumnRows` with ``columns``)."""
        unknown = sorted({d for d in routes.values() if d not in domains})
        if unknown or (default_domain is not None and default_domain not in domains):
            raise DataError(
                f"reward routes name unknown domains {unknown or [default_domain]}; known: {sorted(domains)}"
            )
        self.domains = dict(domains)
        self.routes = dict(routes)
        self.tag_column = tag_column
        self.default_domain = default_domain
        self._next_rank = {
            name: itertools.cycle(range(r.cluster.world_size)) for name, r in self.domains.items()
        }
        self.max_retries = max_retries
        self.columns = columns
        self.on_timeout = on_timeout
        self.retried_requests = 0
        self.restarts = 0
        self.timed_out_rows = 0
        self._epochs: dict[tuple[str, int], int] = {}  # restarts per (domain, rank)

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
        parts: list[_Part] = []
        for domain in dict.fromkeys(domain_B.tolist()):
            rows = np.flatnonzero(domain_B == domain)
            parts += self._submit_domain(domain, batch, rows)
        return RewardJob(self, batch, parts)

    def score(self, batch: Batch) -> Batch:
        """Submit and wait: the input rows with the score columns added."""
        return self.submit(batch).result()

    def _submit_domain(self, domain: str, batch: Batch, rows: np.ndarray) -> list[_Part]:
        request = self.domains[domain]
        shares = [s for s in np.array_split(rows, min(request.cluster.world_size, len(rows))) if len(s)]
        parts = []
        for share in shares:
            rank = next(self._next_rank[domain])
            call = request.submit(rank, self._payload(batch, share))
            parts.append(_Part(share, domain, call, self._epochs.get((domain, rank), 0)))
        return parts

    def _collect(self, batch: Batch, part: _Part) -> Batch:
        """The part's scored rows; when its worker died, restart that rank and send the rows again."""
        for attempt in range(self.max_retries + 1):
            try:
                return _as_batch(part.call.pending.result())
            except WorkerTimeoutError as exc:
                restarted_under_it = part.epoch != self._epochs.get((part.domain, part.call.rank), 0)
                if restarted_under_it and attempt < self.max_retries:
                    self._retry(batch, part, exc, attempt)
                    continue
                return self._abandon(part, exc)
            except WorkerError as exc:
                if attempt == self.max_retries or not _worker_died(exc):
                    raise
                self._retry(batch, part, exc, attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _abandon(self, part: _Part, exc: WorkerTimeoutError) -> Batch:
        """A share past its deadline: restart its rank, and give its rows ``on_timeout``'s columns (or raise)."""
        request, rank = self.domains[part.domain], part.call.rank
        reason = (
            f"{request.cluster.role} rank {rank}: {request.name} of {len(part.rows)} rows did not answer within "
            f"{part.call.pending.target.timeout_s:g}s (the reward role's call_timeout_s); the call was abandoned "
            "and the worker restarted"
        )
        log.warning("%s", reason)
        self._restart(part)
        if self.on_timeout is None:
            raise exc
        self.timed_out_rows += len(part.rows)
        return _as_batch(self.on_timeout(part.domain, len(part.rows), reason))

    def _restart(self, part: _Part) -> None:
        """Restart the part's rank unless another part's failure already replaced it since the part was sent."""
        key = (part.domain, part.call.rank)
        if part.epoch == self._epochs.get(key, 0):
            self.domains[part.domain].cluster.restart_rank(part.call.rank)
            self._epochs[key] = part.epoch + 1
            self.restarts += 1
        part.epoch = self._epochs[key]

    def _retry(self, batch: Batch, part: _Part, exc: WorkerError, attempt: int) -> None:
        """Restart the part's rank, unless another job's retry already replaced it, and send the rows again."""
        request, rank = self.domains[part.domain], part.call.rank
        what = "was restarted under" if isinstance(exc, WorkerTimeoutError) else "died while scoring"
        log.warning(
            "%s rank %d %s %d rows (%s); retrying them on a restarted one (retry %d of %d)",
            request.cluster.role, rank, what, len(part.rows), str(exc).splitlines()[0][:300], attempt + 1,
            self.max_retries,
        )  # fmt: skip
        self._restart(part)
        self.retried_requests += len(part.rows)
        part.call = request.submit(rank, self._payload(batch, part.rows))

    def _payload(self, batch: Batch, rows: np.ndarray) -> Batch | ColumnRows:
        """What a worker gets for ``rows``: a Batch, or plain lists of ``columns`` (see the module docstring)."""
        sub = batch.select(rows)
        if self.columns is None:
            return sub
        return {name: _as_list(sub, name) for name in self.columns if name in sub}


def _as_list(batch: Batch, name: str) -> list[Any]:
    return batch.tensors[name].tolist() if name in batch.tensors else list(batch.non_tensors[name])


def _as_batch(scored: Batch | Mapping[str, Any]) -> Batch:
    if isinstance(scored, Batch):
        return scored
    tensors = {n: as_column(v, "float32") for n, v in scored.items() if _has_axes(n)}
    return Batch(tensors, {n: v for n, v in scored.items() if not _has_axes(n)})


def _has_axes(name: str) -> bool:
    """``scores_B`` names its axes (a tensor column); ``reward_error_report`` does not (per-row values)."""
    head, _, axes = name.rpartition("_")
    return bool(head) and axes.isupper()


def _worker_died(exc: WorkerError) -> bool:
    """Ray's verdict that the actor's process is gone (not an exception its code raised)."""
    return str(getattr(exc, "remote_type", "")) in _DEATH_TYPES


_DEATH_TYPES = frozenset({"RayActorError", "ActorDiedError", "ActorUnavailableError", "OwnerDiedError"})
