"""Partial rollout: samples generated in segments, so a weight update lands between two segments of a sample.

The :class:`~roll.core.scheduler.generate.GenerateScheduler` in partial mode sends every prompt with
:data:`~roll.core.columns.SEGMENT_TOKENS`: the inference worker generates at most that many tokens of each sample
and hands back the samples that are not finished with ``finish_reason`` ``"abort"``. :class:`PartialRollouts`
keeps the books between segments:

- each prompt opens a *group* of ``G`` slots, keyed ``(request id, place in the request)`` (the group's place in
  the prompt feed, which fixes its row order in a sync batch);
- a finished sample fills its slot; an aborted one is queued as a row to continue (``response_prefix_ids`` = what
  it has, with its log-probs and per-token versions), and the scheduler sends queued rows before new prompts;
- a group whose ``G`` slots are full is complete: it goes on to scoring and the buffers like any other.

Ray runs an actor's calls in order, so a weight update sent to the inference cluster waits for at most the
segments already queued on each worker, and every continuation sent after it samples under the new weights: the
in-flight samples are interrupted at a segment boundary and continue from their prefix, each token recording the
version that sampled it. ``max_staleness`` bounds the lag of a sample's *oldest* token (the scheduler evicts open
groups that fall behind, so no compute goes into a sample that could never be trained on).

Checkpoint (:meth:`PartialRollouts.state`): the open groups' finished samples, the queued rows, and the requests on
the workers at that moment (their rows are sent again after a resume: the tokens a request was adding are
generated again, its prompt is not lost).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from roll.core import columns as C
from roll.core.batch import Batch, as_column
from roll.core.errors import DataError

__all__ = ["GroupKey", "PartialRollouts"]

GroupKey = tuple[int, int]
"""(request id, place in the request): a group's place in the prompt feed."""

_REQUEST_DROPS = (C.RESPONSE_IDS, C.FINISH_REASON, C.TEXT, C.POLICY_VERSION)
"""Output columns that a row to continue leaves behind (its tokens travel as the prefix)."""


class PartialRollouts:
    """The books of partial rollout (see the module docstring). Not thread-safe: the scheduler holds its lock."""

    def __init__(self, group_size: int, segment_tokens: int) -> None:
        if group_size < 1 or segment_tokens < 1:
            raise DataError(f"group_size and segment_tokens must be >= 1, got {group_size}, {segment_tokens}")
        self.G, self.segment = group_size, segment_tokens
        self._open: dict[GroupKey, list[Batch | None]] = {}
        self._queue: deque[tuple[GroupKey, int, Batch]] = deque()  # (group, sample, request-form row)
        self._resend: deque[tuple[int, Batch]] = deque()  # fresh prompts of requests lost in a restart
        self._sent: dict[int, list[tuple[GroupKey, int]]] = {}  # job -> (group, sample) of each returned row
        self._inflight: dict[
            int, tuple[int | None, Batch]
        ] = {}  # job -> (origin of fresh prompts, rows sent)
        self.aborts = 0
        """Samples cut at a segment boundary so far."""
        self.evicted = 0

    # --------------------------------------------------------------------------------------- requests

    def has_work(self) -> bool:
        """Rows to continue or prompts to send again are waiting."""
        return bool(self._queue or self._resend)

    def num_open(self) -> int:
        """Groups started and not yet complete (being generated, queued, or partly finished)."""
        return len(self._open)

    def fresh(self, job_id: int, prompts: Batch, origin: int | None = None) -> Batch:
        """Open one group per prompt row (keyed by ``origin``, default ``job_id``) and return the request."""
        origin = job_id if origin is None else origin
        for i in range(len(prompts)):
            self._open.setdefault((origin, i), [None] * self.G)
        self._sent[job_id] = [((origin, i), s) for i in range(len(prompts)) for s in range(self.G)]
        self._inflight[job_id] = (origin, prompts)
        return self._with_segment(prompts)

    def next_request(self, job_id: int, max_rows: int) -> Batch | None:
        """The next request of waiting work: prompts to send again, else up to ``max_rows`` rows to continue."""
        if self._resend:
            origin, prompts = self._resend.popleft()
            return self.fresh(job_id, prompts, origin)
        picked: list[tuple[GroupKey, int, Batch]] = []
        while self._queue and len(picked) < max_rows:
            key, sample, row = self._queue.popleft()
            if key in self._open:  # an evicted group's rows are dropped here
                picked.append((key, sample, row))
        if not picked:
            return None
        rows = Batch.concat([row for _, _, row in picked])
        self._sent[job_id] = [(key, sample) for key, sample, _ in picked]
        self._inflight[job_id] = (None, rows)
        return self._with_segment(rows)

    def _with_segment(self, rows: Batch) -> Batch:
        out = Batch(dict(rows.tensors), dict(rows.non_tensors), rows.meta)
        out.tensors[C.SEGMENT_TOKENS] = as_column(np.full(len(rows), self.segment), "int64")  # type: ignore[assignment]
        return out

    # --------------------------------------------------------------------------------------- results

    def returned(self, job_id: int, samples: Batch) -> list[tuple[GroupKey, Batch]]:
        """File a request's rows; returns the groups it completed (``G`` rows each, in sample order)."""
        keys = self._sent.pop(job_id)
        self._inflight.pop(job_id, None)
        if len(keys) != len(samples):
            raise DataError(f"a partial-rollout request sent {len(keys)} samples and got {len(samples)} back")
        reasons = samples.non_tensors[C.FINISH_REASON]
        touched: list[GroupKey] = []
        for r, (key, sample) in enumerate(keys):
            slots = self._open.get(key)
            if slots is None:  # evicted while in flight
                continue
            row = samples.select([r])
            if reasons[r] == "abort":
                self.aborts += 1
                self._queue.append((key, sample, _to_request(row)))
            else:
                slots[sample] = row
                touched.append(key)
        done = [key for key in dict.fromkeys(touched) if all(s is not None for s in self._open[key])]
        return [(key, Batch.concat([s for s in self._open.pop(key) if s is not None])) for key in done]

    def evict_older_than(self, oldest: int) -> int:
        """Drop open groups holding a token sampled before version ``oldest``; returns how many."""
        stale = {
            key
            for key, slots in self._open.items()
            if any(_oldest(s) < oldest for s in slots if s is not None)
        }
        stale |= {key for key, _, row in self._queue if key in self._open and _oldest(row) < oldest}
        for key in stale:
            del self._open[key]
        self.evicted += len(stale)
        return len(stale)

    # --------------------------------------------------------------------------------------- checkpoint

    def state(self) -> dict[str, Any]:
        """Everything needed to lose no prompt: open groups, queued rows, and the requests now on the workers
        (to be sent again)."""
        queue = list(self._queue)
        resend = list(self._resend)
        for job_id, (origin, rows) in self._inflight.items():
            if origin is not None:
                resend.append((origin, rows))
            else:
                queue += [(key, s, rows.select([r])) for r, (key, s) in enumerate(self._sent[job_id])]
        return {
            "open": dict(self._open),
            "queue": queue,
            "resend": resend,
            "aborts": self.aborts,
            "inflight_requests": len(self._inflight),  # of those, how many were on the workers
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self._open = dict(state["open"])
        self._queue = deque(state["queue"])
        self._resend = deque(state["resend"])
        self.aborts = int(state["aborts"])
        self._sent.clear()
        self._inflight.clear()


def _to_request(row: Batch) -> Batch:
    """A returned unfinished row as a row to continue: its tokens become the prefix."""
    non_tensors = {k: v for k, v in row.non_tensors.items() if k not in _REQUEST_DROPS}
    tensors = {k: v for k, v in row.tensors.items() if k not in _REQUEST_DROPS}
    out = Batch(tensors, non_tensors, row.meta)
    out[C.RESPONSE_PREFIX_IDS] = row.non_tensors[C.RESPONSE_IDS]
    return out


def _oldest(row: Batch) -> int:
    versions = row.non_tensors.get(C.RESPONSE_POLICY_VERSION)
    if versions is None or not versions[0]:
        return int(row.tensors[C.POLICY_VERSION][0]) if C.POLICY_VERSION in row.tensors else 0
    return min(int(v) for v in versions[0])
