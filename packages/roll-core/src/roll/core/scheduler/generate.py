"""GenerateScheduler: rollouts of ``G`` samples per prompt, sent to inference workers request by request.

What it does, in the order a step sees it:

- **Request-level scheduling.** Prompts are drawn from a prompt source in small requests (``request_prompts``
  prompts each) and sent to one inference rank at a time through the driver's
  :class:`~roll.core.scheduler.rank_calls.RankRequest` (``RankRequest.bind(infer.generate, params)``: the method,
  from a typed handle, and its arguments after the prompts);
  each rank holds at most ``max_inflight_per_rank`` requests, and a rank that answers gets the next request at
  once. Fast ranks take more requests than slow ones, and one long request does not hold back a whole step.
- **Scoring overlaps generation.** When a request's samples come back they go straight to the reward scheduler
  (anything with ``submit(batch) -> job`` whose ``job.refs``/``job.result()`` behave like
  :class:`~roll.core.scheduler.reward.RewardJob`), while the inference ranks work on the next requests.
- **Deadlines.** The scheduler never waits past the earliest deadline of what is in flight: a generation request
  past its method's timeout raises :class:`~roll.core.errors.WorkerTimeoutError` naming role, rank and method,
  and a scoring job past its deadline is read then (the reward scheduler abandons the hung share, restarts its
  worker and marks its rows failed), so a hung call costs its timeout, never the whole run.
- **Dynamic sampling.** A scored request passes through ``group_filter`` (a callback, so the filter rule lives
  with the algorithm, not here): it gets the scored rows (prompt-major, ``G`` rows per prompt) and returns a
  bool per group and counts to log. Dropped groups are replaced by drawing more prompts, in at most
  ``max_rounds`` rounds (each round sizes itself by the keep rate seen so far). When the rounds run out the
  batch is filled with the most recent dropped groups, and ``rollout/groups_filled`` says how many.
- **Policy versions and staleness.** Every sample carries the policy version that generated it
  (``version_column``, written by the inference worker). ``get_batch(n, trainer_version)`` never returns a
  group whose version lags ``trainer_version`` by more than ``max_staleness``; staler groups are dropped and
  counted (``rollout/groups_stale``).
- **Async mode** (``async_ratio > 0``): a background thread keeps generating and scoring ahead into a buffer,
  so the rollouts of step ``k + 1`` are produced while step ``k`` trains; ``max_staleness`` defaults to
  ``ceil(async_ratio)``. The thread runs at most ``lead = ceil(n * min(async_ratio, max_staleness))`` groups
  ahead (kept plus in flight) while the trainer trains, and ``n + lead`` while a :meth:`get_batch` waits: a
  group it starts while the trainer holds version ``v`` is trained at step ``v + 1`` at the latest (the buffer
  is first in, first out), so in a steady run nothing is generated only to be evicted as stale. With nothing to
  do it sleeps on a condition (woken by :meth:`get_batch` and :meth:`close`), never spins. Weight updates sent
  to the inference cluster queue behind the requests already sent to an actor (Ray runs an actor's calls in
  order), so a request never sees weights change half-way. With ``async_ratio == 0`` (sync mode) the caller's
  thread does the work inside :meth:`get_batch` and ``max_staleness`` is 0.
- **Row order**: in sync mode a batch's groups are in prompt-feed order, whatever order requests finished in, so
  two runs of one config train on identical micro-batches. Async mode hands groups out first come, first served:
  timing decides which groups (and which weights made them) land in a step, so it is not reproducible.
- **Counters per batch**: a batch's metrics count what happened since the previous batch was handed out;
  ``rollout/prompts_generated`` counts the prompts whose groups came back (kept or dropped) in that window, so
  in async mode it is the generation done for this batch while the previous step trained.
- **Partial rollout** (``partial_segment`` set, :mod:`roll.core.scheduler.partial`): samples come back in
  segments of at most that many tokens; unfinished ones are continued (before new prompts are sent) from their
  prefix, under whatever weights the worker serves by then, so a weight update interrupts long samples instead of
  waiting for them. Each token records its version; a group's version is that of its oldest token, so
  ``max_staleness`` bounds every token of a trained sample. :meth:`prefetch` runs only the first segment of a
  step's prompts (the deterministic ``step_ahead`` use); :meth:`buffer_state` / :meth:`load_buffer_state` carry the
  buffered groups, the partial samples and the requests in flight through a checkpoint.
- **Validation**: :meth:`generate_all` runs a fixed prompt batch request by request, with no filter.
- **Seeded per prompt** (``seed`` set): every prompt row sent gets :data:`~roll.core.columns.PROMPT_SEED` =
  ``derive_seed(seed, TRAIN_STREAM, n)`` for the ``n``-th prompt drawn from the source since the run began
  (``generate_all``: ``derive_seed(seed, EVAL_STREAM, row)``), unless the source set one. The inference workers
  seed each sample from it, so what a prompt samples depends on the run seed and its place in the feed only:
  not on batching, ranks or what was generated before. ``n`` is part of :meth:`state_dict`, so a run resumed
  from a checkpoint taken between steps continues the same seed sequence.

Generic: the scheduler knows a Batch, a bound cluster method (:class:`RankRequest`), the group size, a version column
and callbacks.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import ray

from roll.core import columns as C
from roll.core.batch import Array, Batch, as_column
from roll.core.errors import DataError, RollError
from roll.core.scheduler.partial import GroupKey, PartialRollouts
from roll.core.scheduler.rank_calls import CallPool, RankRequest, bounded_wait
from roll.core.seeding import EVAL_STREAM, TRAIN_STREAM, derive_seed

__all__ = [
    "GenerateOptions",
    "GenerateScheduler",
    "GroupFilter",
    "PromptSource",
    "RolloutBatch",
    "Scorer",
]

log = logging.getLogger(__name__)

PromptSource = Callable[[int], Batch]
"""``source(n)`` returns the next ``n`` prompts as a Batch (one row per prompt)."""

GroupFilter = Callable[[Batch, int], tuple[Array, Mapping[str, float]]]
"""``filter(scored, G)`` gets ``P * G`` scored rows and returns ``keep_P`` (bool) and counts to log."""


class _Job(Protocol):
    @property
    def refs(self) -> list[Any]: ...

    @property
    def deadline(self) -> float:
        """``time.monotonic()`` by which :meth:`ready` turns true even if a call hangs (``inf``: no deadline)."""
        ...

    def ready(self) -> bool: ...

    def result(self) -> Batch: ...


class Scorer(Protocol):
    """What the scheduler needs from a reward scheduler."""

    def submit(self, batch: Batch) -> _Job: ...


@dataclass(frozen=True)
class GenerateOptions:
    """Knobs of the scheduler (see the module docstring)."""

    group_size: int
    request_prompts: int = 4
    max_inflight_per_rank: int = 2
    max_rounds: int = 4
    async_ratio: float = 0.0
    max_staleness: int | None = None
    version_column: str = C.POLICY_VERSION
    poll_s: float = 0.5
    get_timeout_s: float = 3600.0
    carry_columns: tuple[str, ...] = ()
    """Prompt columns (ground truth, tag, ...) copied onto each prompt's ``G`` samples when the worker's output
    lacks them."""
    partial_segment: int | None = None
    """Partial rollout: the most tokens a sample gets per request (None: whole samples per request)."""
    seed: int | None = None
    """The run's sampling seed: each prompt sent gets ``prompt_seed_B`` (see the module docstring); None sends
    none (the workers then sample from their own RNG state, which a resume does not reproduce)."""

    @property
    def staleness_bound(self) -> int:
        if self.max_staleness is not None:
            return self.max_staleness
        return math.ceil(self.async_ratio)

    def lead_groups(self, num_groups: int) -> int:
        """Groups the async thread may hold or run ahead of the step being trained (see the module docstring)."""
        return math.ceil(num_groups * min(self.async_ratio, self.staleness_bound))


@dataclass
class _Group:
    batch: Batch
    version: int
    order: tuple[int, int] = (0, 0)
    """(request id, place in the request): the group's place in the prompt feed, whatever order requests finish in."""


@dataclass
class RolloutBatch:
    """A training batch of whole groups plus what happened while collecting it."""

    batch: Batch
    versions: list[int]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class _Counters:
    prompts: int = 0
    """Prompts sent (the position of the per-prompt seed stream)."""
    finished: int = 0
    """Prompts whose groups came back, kept or dropped."""
    requests: int = 0
    kept: int = 0
    dropped: int = 0
    stale: int = 0
    filled: int = 0
    aborts: int = 0
    """Partial rollout: samples cut at a segment boundary (continued later, possibly under newer weights)."""
    rounds: int = 0
    gen_s: float = 0.0
    reward_s: float = 0.0
    filter_stats: dict[str, float] = field(default_factory=dict)

    def snapshot(self) -> _Counters:
        return _Counters(**{**vars(self), "filter_stats": dict(self.filter_stats)})

    def as_metrics(self) -> dict[str, float]:
        out = {
            "rollout/prompts_generated": float(self.finished),
            "rollout/requests": float(self.requests),
            "rollout/groups_kept": float(self.kept),
            "rollout/groups_dropped": float(self.dropped),
            "rollout/groups_stale": float(self.stale),
            "rollout/groups_filled": float(self.filled),
            "rollout/aborts": float(self.aborts),
            "rollout/rounds": float(self.rounds),
            "time/generate_request_s": self.gen_s,
            "time/reward_request_s": self.reward_s,
        }
        out.update({f"rollout/filter_{k}": v for k, v in self.filter_stats.items()})
        return out


class GenerateScheduler:
    """See the module docstring. Call :meth:`close` (or use ``with``) to stop the async thread."""

    def __init__(
        self,
        request: RankRequest[Batch],
        source: PromptSource,
        options: GenerateOptions,
        *,
        scorer: Scorer | None = None,
        group_filter: GroupFilter | None = None,
    ) -> None:
        if options.group_size < 1 or options.request_prompts < 1 or options.max_rounds < 1:
            raise DataError(f"group_size, request_prompts and max_rounds must be >= 1: {options}")
        self.request = request
        """What each request runs: ``request.submit(rank, prompts)`` returns the prompts' samples."""
        self.source = source
        self.options = options
        self.scorer = scorer
        self.group_filter = group_filter
        self._kept: deque[_Group] = deque()
        self._rejected: deque[_Group] = deque(maxlen=256)
        self._pool: CallPool[int] = CallPool()
        self._prompts: dict[int, Batch] = {}
        self._jobs: dict[int, tuple[Any, float, int]] = {}  # id -> (scoring job or None, started, prompts)
        self._next_id = 0
        self._counters = _Counters()
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._step_groups = 0  # n of the current get_batch
        self._waiting = False  # a get_batch waits for groups
        self._since: _Counters | None = None  # counters when the previous async batch was handed out
        seg = options.partial_segment
        self._partial = PartialRollouts(options.group_size, seg) if seg is not None else None
        self._orders: dict[int, GroupKey] = {}  # partial: scoring job -> the group's key
        self._scoring: dict[
            int, Batch
        ] = {}  # partial: scoring job -> its input (a checkpoint scores it again)
        self._hold_partials = False  # prefetch: leave unfinished samples queued

    @property
    def is_async(self) -> bool:
        return self.options.async_ratio > 0

    # ------------------------------------------------------------------------------------------- public API

    def get_batch(self, num_groups: int, trainer_version: int) -> RolloutBatch:
        """``num_groups`` groups (``num_groups * G`` rows, prompt-major), none staler than the bound."""
        if self.is_async:
            self._ensure_thread(num_groups)
            return self._take_async(num_groups, trainer_version)
        return self._take_sync(num_groups, trainer_version)

    def generate_all(self, prompts: Batch, request: RankRequest[Batch] | None = None) -> Batch:
        """Samples for every prompt of ``prompts`` (``G`` per prompt, prompt order), request by request, through
        ``request`` (e.g. the same method bound to evaluation's sampling parameters; default: the scheduler's)."""
        call = request or self.request
        pool: CallPool[int] = CallPool()
        prompts = self._seeded(prompts, EVAL_STREAM, 0)
        requests = prompts.split(_sizes(len(prompts), self.options.request_prompts))
        results: dict[int, Batch] = {}
        free = self._free_slots(pool, call)
        for i, rows in enumerate(requests):
            while not free:
                results.update({key: out for key, _, out in pool.wait_any()})
                free = self._free_slots(pool, call)
            pool.add(i, call.submit(free.pop(0), rows))
        results.update({key: out for key, _, out in pool.drain(self.options.get_timeout_s)})
        return Batch.concat([self._carry(requests[i], results[i]) for i in range(len(requests))])

    def state(self) -> dict[str, float]:
        """Cumulative counters (for logs and tests)."""
        with self._lock:
            return self._counters.as_metrics()

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for a checkpoint taken between steps: the cumulative counters, among them the number
        of prompts drawn (the position of the per-prompt seed stream). Buffered and in-flight groups (async mode)
        are not part of it."""
        with self._lock:
            return {"counters": {**vars(self._counters), "filter_stats": dict(self._counters.filter_stats)}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (call before the first :meth:`get_batch`)."""
        counters = dict(state["counters"])
        with self._lock:
            self._counters = _Counters(**counters)

    def prefetch(self, num_groups: int) -> int:
        """Partial rollout, sync mode: send ``num_groups`` prompts and run only their first segment (finished
        groups are scored into the buffer; unfinished samples wait, queued). The next :meth:`get_batch` continues
        them under the weights served then. Returns ``num_groups``."""
        if self._partial is None or self.is_async:
            raise DataError(
                "prefetch is the partial-rollout step_ahead path: set partial_segment, async_ratio 0"
            )
        self._hold_partials = True
        self._since = self._counters.snapshot()  # the next batch's counters include this prefetch
        try:
            self._run_round(num_groups)
        finally:
            self._hold_partials = False
        return num_groups

    def buffer_state(self, source_state: Callable[[], Any] = lambda: None) -> tuple[Any, dict[str, Any]]:
        """``(source_state(), buffers)`` taken together, so no prompt is both drawn and unrecorded: the groups
        in the buffers, and with partial rollout the open groups, the queued rows, the requests on the workers
        and those being scored (all sent again after :meth:`load_buffer_state`). Picklable."""
        with self._lock:
            buffers: dict[str, Any] = {
                "next_id": self._next_id,
                "kept": [(g.batch, g.version, g.order) for g in self._kept],
                "rejected": [(g.batch, g.version, g.order) for g in self._rejected],
                "since": None if self._since is None else vars(self._since.snapshot()),
            }
            if self._partial is not None:
                buffers["partial"] = self._partial.state()
                buffers["scoring"] = [(self._orders[i], b) for i, b in self._scoring.items()]
            return source_state(), buffers

    def load_buffer_state(self, buffers: Mapping[str, Any]) -> None:
        """Continue from :meth:`buffer_state` (before the first :meth:`get_batch`)."""
        with self._lock:
            self._next_id = max(self._next_id, int(buffers["next_id"]))
            if buffers.get("since") is not None:  # the next batch's counters started before the checkpoint
                self._since = _Counters(**buffers["since"])
            self._kept.extend(_Group(b, v, (o[0], o[1])) for b, v, o in buffers["kept"])
            self._rejected.extend(_Group(b, v, (o[0], o[1])) for b, v, o in buffers["rejected"])
            if self._partial is not None and "partial" in buffers:
                self._partial.load_state(buffers["partial"])
                for key, group in buffers["scoring"]:
                    self._score_group((key[0], key[1]), group)

    def close(self) -> None:
        """Stop the async thread, and a :meth:`get_batch` running in another thread (it raises within
        ``poll_s``); requests already on the workers finish there and are discarded."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def __enter__(self) -> GenerateScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ sync mode

    def _take_sync(self, num_groups: int, trainer_version: int) -> RolloutBatch:
        start, self._since = self._since or self._counters.snapshot(), None
        generated = kept_before = 0
        for round_ in range(self.options.max_rounds):
            self._evict_stale(trainer_version)
            pending = self._partial.num_open() if self._partial is not None else 0
            need = num_groups - len(self._kept) - pending
            if need <= 0 and not pending:
                break
            rate = (len(self._kept) - kept_before) / generated if generated else 1.0
            n_prompts = need if round_ == 0 else min(4 * num_groups, math.ceil(need / max(rate, 0.1)))
            n_prompts = max(n_prompts, 0)
            self._counters.rounds += 1
            generated += n_prompts
            self._run_round(n_prompts)
        self._evict_stale(trainer_version)
        self._in_feed_order()
        return self._pop_groups(num_groups, start, surplus_dropped=True)

    def _in_feed_order(self) -> None:
        """Sort the buffers by the groups' place in the prompt feed. Requests finish (and get scored) in an order
        that timing decides; the batch's row order must not, or its micro-batches, padding and float sums would
        differ between two runs of one config."""
        for buffer in (self._kept, self._rejected):
            ordered = sorted(buffer, key=lambda g: g.order)
            buffer.clear()
            buffer.extend(ordered)

    def _run_round(self, n_prompts: int) -> None:
        """Generate and score ``n_prompts`` prompts request by request; results land in the buffers. Wakes up
        every ``poll_s`` to see whether :meth:`close` was called (a thread may run this: a shutdown must not wait
        for a stuck call's deadline)."""
        remaining = n_prompts
        while remaining > 0 or self._busy():
            if self._stop.is_set():
                raise RollError("generation stopped: the generate scheduler was closed mid-batch")
            remaining -= self._submit_while_free(remaining)
            self._wait_and_handle(min(self.options.get_timeout_s, self.options.poll_s))

    # ----------------------------------------------------------------------------------------- async mode

    def _ensure_thread(self, num_groups: int) -> None:
        with self._lock:
            self._step_groups = num_groups
            if self._since is None:
                self._since = self._counters.snapshot()
        if self._thread is None:
            self._thread = threading.Thread(target=self._pump, name="roll-generate", daemon=True)
            self._thread.start()

    def _room(self) -> int:
        """Prompts the async thread may send now (call under the lock)."""
        n = self._step_groups
        capacity = self.options.lead_groups(n) + (n if self._waiting else 0)
        return max(capacity - len(self._kept) - self._inflight_prompts(), 0)

    def _pump(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    room = self._room()
                    if not room and not self._busy():  # nothing to do until a get_batch takes groups
                        self._lock.wait(timeout=self.options.poll_s)
                        continue
                self._submit_while_free(room)
                self._wait_and_handle(self.options.poll_s)
        except BaseException as exc:  # handed to the trainer's thread, which raises it
            log.exception("generation thread failed")
            with self._lock:
                self._error = exc
                self._lock.notify_all()

    def _take_async(self, num_groups: int, trainer_version: int) -> RolloutBatch:
        deadline = time.monotonic() + self.options.get_timeout_s
        with self._lock:
            start = self._since or self._counters.snapshot()
            try:
                while True:
                    if self._error is not None:
                        raise self._error
                    self._evict_stale(trainer_version)
                    spent = self._counters.finished - start.finished
                    if len(self._kept) >= num_groups or spent >= self.options.max_rounds * num_groups:
                        out = self._pop_groups(num_groups, start, surplus_dropped=False)
                        self._since = self._counters.snapshot()
                        return out
                    if time.monotonic() > deadline:
                        raise DataError(f"no rollout batch within {self.options.get_timeout_s:g}s")
                    if not self._waiting:
                        self._waiting = True
                        self._lock.notify_all()  # the thread may now run a whole step ahead
                    self._lock.wait(timeout=self.options.poll_s)
            finally:
                self._waiting = False

    # ------------------------------------------------------------------------------------------- plumbing

    def _inflight_prompts(self) -> int:
        """Prompts sent but not yet in a buffer: being generated or being scored (partial rollout: the open
        groups, plus the complete groups being scored)."""
        open_groups = self._partial.num_open() if self._partial is not None else 0
        return open_groups + sum(n for _, _, n in self._jobs.values())

    def _free_slots(self, pool: CallPool[Any], request: RankRequest[Batch]) -> list[int]:
        """One entry per free request slot of ``request``'s ranks, rank by rank (a rank with two free slots appears
        twice)."""
        busy = pool.ranks()
        cap = self.options.max_inflight_per_rank
        return [r for r in range(request.cluster.world_size) for _ in range(cap - busy.count(r))]

    def _submit_while_free(self, budget: int) -> int:
        """Send requests to free ranks while ``budget`` prompts remain (partial rollout: rows to continue first,
        outside the budget); returns the prompts sent. Under the lock, so a checkpoint never sees a prompt drawn
        from the source but not yet recorded as in flight."""
        sent = 0
        with self._lock:
            for rank in self._free_slots(self._pool, self.request):
                if self._submit_partial(rank):
                    continue
                if sent >= budget:
                    break
                prompts = self.source(min(self.options.request_prompts, budget - sent))
                self._submit_request(rank, prompts)
                sent += len(prompts)
        return sent

    def _submit_partial(self, rank: int) -> bool:
        """Send waiting partial-rollout work (rows to continue, prompts to send again) to ``rank``, if any."""
        if self._partial is None or self._hold_partials or not self._partial.has_work():
            return False
        rows = self._partial.next_request(
            self._next_id, self.options.request_prompts * self.options.group_size
        )
        if rows is None:
            return False
        self._send(rank, rows, 0)
        return True

    def _send(self, rank: int, rows: Batch, n_prompts: int) -> None:
        job_id = self._next_id
        self._next_id += 1
        call = self.request.submit(rank, rows)
        self._pool.add(job_id, call)
        self._prompts[job_id] = rows
        self._jobs[job_id] = (None, time.perf_counter(), n_prompts)
        self._counters.requests += 1

    def _submit_request(self, rank: int, prompts: Batch) -> None:
        prompts = self._seeded(prompts, TRAIN_STREAM, self._counters.prompts)
        self._counters.prompts += len(prompts)
        if self._partial is not None:  # its groups count as open from now on
            self._send(rank, self._partial.fresh(self._next_id, prompts), 0)
        else:
            self._send(rank, prompts, len(prompts))

    def _wait_and_handle(self, timeout_s: float) -> None:
        """Wait until a generation or a scoring job finishes (or ``timeout_s``, or the first deadline of what is
        in flight), then move every finished or expired one on."""
        jobs = [job for job, _, _ in self._jobs.values() if job is not None]
        refs = self._pool.refs() + [ref for job in jobs for ref in job.refs]
        deadline = min([self._pool.earliest_deadline(), *(job.deadline for job in jobs)])
        if refs:
            ray.wait(refs, num_returns=1, timeout=bounded_wait(timeout_s, deadline))
        for job_id, _, samples in self._pool.wait_any(0):
            with self._lock:  # a checkpoint sees the request either in flight or filed
                self._on_generated(job_id, self._carry(self._prompts.pop(job_id), samples))
        # earliest deadline first: a share queued behind a hung one on the same rank is read after the hung one's
        # restart has sent it again, not abandoned with it
        ready = [
            (job.deadline, i, job) for i, (job, _, _) in self._jobs.items() if job is not None and job.ready()
        ]
        for _, job_id, job in sorted(ready, key=lambda entry: entry[:2]):
            self._on_scored(job_id, job.result())

    def _seeded(self, prompts: Batch, stream: int, first: int) -> Batch:
        """``prompts`` with ``prompt_seed_B`` (row ``i``: ``derive_seed(seed, stream, first + i)``) when the
        scheduler has a seed and the rows carry none."""
        if self.options.seed is None or C.PROMPT_SEED in prompts:
            return prompts
        seeds = [derive_seed(self.options.seed, stream, first + i) for i in range(len(prompts))]
        return prompts.union(Batch({C.PROMPT_SEED: as_column(seeds, "int64")}))

    def _carry(self, prompts: Batch, samples: Batch) -> Batch:
        missing = [c for c in self.options.carry_columns if c not in samples]
        if not missing:
            return samples
        per_prompt = len(samples) // max(len(prompts), 1)
        extra = prompts.select(np.repeat(np.arange(len(prompts)), per_prompt))
        return samples.union(Batch({}, {c: extra.non_tensors[c] for c in missing}))

    def _busy(self) -> bool:
        waiting = self._partial is not None and not self._hold_partials and self._partial.has_work()
        return bool(self._jobs) or waiting

    def _on_generated(self, job_id: int, samples: Batch) -> None:
        _, started, n = self._jobs[job_id]
        now = time.perf_counter()
        with self._lock:
            self._counters.gen_s += now - started
        if self._partial is not None:
            self._on_segment(job_id, samples)
            return
        if self.scorer is None:
            with self._lock:
                self._jobs.pop(job_id)
            self._accept(samples, (job_id, 0))
            return
        job = self.scorer.submit(samples)
        with self._lock:
            self._jobs[job_id] = (job, now, n)

    def _on_segment(self, job_id: int, samples: Batch) -> None:
        """Partial rollout: file a request's rows; complete groups go on to scoring (or straight to the buffers)."""
        assert self._partial is not None
        with self._lock:
            self._jobs.pop(job_id)
            before = self._partial.aborts
            complete = self._partial.returned(job_id, samples)
            self._counters.aborts += self._partial.aborts - before
        for key, group in complete:
            self._score_group(key, group)

    def _score_group(self, key: GroupKey, group: Batch) -> None:
        if self.scorer is None:
            self._accept(group, key)
            return
        score_id = self._next_id
        self._next_id += 1
        with self._lock:
            self._jobs[score_id] = (self.scorer.submit(group), time.perf_counter(), 1)
            self._orders[score_id], self._scoring[score_id] = key, group

    def _on_scored(self, job_id: int, scored: Batch) -> None:
        with self._lock:
            _, started, _ = self._jobs.pop(job_id)
            self._counters.reward_s += time.perf_counter() - started
            self._scoring.pop(job_id, None)
            order = self._orders.pop(job_id, (job_id, 0))
            self._accept(scored, order)  # under the lock: a checkpoint sees the group scoring or buffered

    def _accept(self, scored: Batch, order: GroupKey) -> None:
        """Split a scored request into groups, filter them, and put them into the buffers; ``order`` is the first
        group's place in the feed."""
        G = self.options.group_size
        if len(scored) % G:
            raise DataError(f"generate returned {len(scored)} rows, not a multiple of the group size {G}")
        parts = scored.split([G] * (len(scored) // G))
        groups = [_Group(g, self._version(g), (order[0], order[1] + i)) for i, g in enumerate(parts)]
        keep_P, stats = self._filter(scored, len(groups))
        with self._lock:
            for group, keep in zip(groups, keep_P.tolist()):
                (self._kept if keep else self._rejected).append(group)
            self._counters.finished += len(groups)
            self._counters.kept += int(keep_P.sum())
            self._counters.dropped += int((~keep_P).sum())
            for name, value in stats.items():
                self._counters.filter_stats[name] = self._counters.filter_stats.get(name, 0.0) + float(value)
            self._lock.notify_all()

    def _filter(self, scored: Batch, num_groups: int) -> tuple[np.ndarray, Mapping[str, float]]:
        if self.group_filter is None:
            return np.ones(num_groups, dtype=bool), {}
        keep_P, stats = self.group_filter(scored, self.options.group_size)
        return np.asarray(keep_P).astype(bool).reshape(-1), stats

    def _version(self, group: Batch) -> int:
        column = self.options.version_column
        if column in group:
            return int(np.min(np.asarray(group[column])))
        return int(group.meta.get("policy_version", 0))

    def _evict_stale(self, trainer_version: int) -> None:
        oldest = trainer_version - self.options.staleness_bound
        if self._partial is not None:  # open groups that can no longer be trained on get no more compute
            self._counters.stale += self._partial.evict_older_than(oldest)
        for buffer in (self._kept, self._rejected):
            fresh = [g for g in buffer if g.version >= oldest]
            if buffer is self._kept:
                self._counters.stale += len(buffer) - len(fresh)
            buffer.clear()
            buffer.extend(fresh)

    def _pop_groups(self, num_groups: int, start: _Counters, *, surplus_dropped: bool) -> RolloutBatch:
        chosen = [self._kept.popleft() for _ in range(min(num_groups, len(self._kept)))]
        filled = min(num_groups - len(chosen), len(self._rejected))
        chosen += [self._rejected.pop() for _ in range(filled)]
        if len(chosen) < num_groups:
            raise DataError(
                f"only {len(chosen)} of {num_groups} groups after {self.options.max_rounds} rounds"
            )
        self._counters.filled += filled
        if surplus_dropped:  # sync mode: leftovers would be one version stale next step
            self._counters.dropped += len(self._kept)
            self._kept.clear()
            self._rejected.clear()
        metrics = _delta(self._counters, start)
        return RolloutBatch(Batch.concat([g.batch for g in chosen]), [g.version for g in chosen], metrics)


def _delta(now: _Counters, start: _Counters) -> dict[str, float]:
    after, before = now.as_metrics(), start.as_metrics()
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def _sizes(n: int, chunk: int) -> list[int]:
    return [min(chunk, n - i) for i in range(0, n, chunk)]
