"""What a run survives: preemption signals and lost workers. Used by :class:`~roll.core.run.Run`.

- **Preemption** (:class:`StopSignals`): the first SIGTERM or SIGINT (Ctrl-C) during the step loop only asks the
  loop to stop; the current step finishes, a checkpoint is written and the run raises :class:`Preempted` (the CLI
  exits with :data:`EXIT_PREEMPTED`). The step gets ``stop_grace_s`` to finish: a step stuck in a call (a hung
  reward, an env, a collective) is abandoned then, so a preempted run leaves within its notice period instead of
  at the call's deadline. A second signal, one that arrives before the loop, or the end of the grace abandons the
  step with ``KeyboardInterrupt`` (the CLI exits 130) whose message says why (``SIGTERM during step 4: ...``:
  Ray turns an interrupt inside ``ray.get``/``ray.wait`` into a bare ``KeyboardInterrupt()``, so the reason is
  kept here, :attr:`StopSignals.reason`, not in the exception); the previous checkpoint stays whole (checkpoints
  are written to a temp dir and renamed).
- **Lost workers** (:func:`find_lost_worker`): when a step fails, every actor of every cluster is pinged; one whose
  process is gone (SIGKILL, OOM kill, a lost node) is named with its role, rank and Ray's cause. The pipeline then
  tears its clusters down, rebuilds them and resumes from the latest checkpoint. A failure with every actor alive
  (a bug in a step, bad data) is not retried: it would fail again.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

from roll.core.errors import RollError

logger = logging.getLogger(__name__)

EXIT_PREEMPTED = 75
"""``roll train``'s exit code after a graceful stop on SIGTERM/SIGINT: a checkpoint was written; rerun the same
command with ``resume=auto`` to continue exactly (75 is ``EX_TEMPFAIL``, "try again later")."""

_PING_TIMEOUT_S = 10.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(RollError, RuntimeError):
    """The run stopped on a signal after finishing a step and writing its checkpoint."""


class StopSignals:
    """SIGTERM/SIGINT handling of a run; see the module docstring. Only installs itself in the main thread.

    The pipeline sets :attr:`step` (steps completed) as its loop runs, and :attr:`armed` while a step runs.
    """

    def __init__(self, grace_s: float | None = None) -> None:
        self.signum: int | None = None
        self.armed = False
        self.step = 0
        self.grace_s = grace_s
        self.reason: str | None = None
        """Why the run was interrupted (the message of the ``KeyboardInterrupt`` the pipeline raises)."""
        self._timer: threading.Timer | None = None
        self._grace_over: str | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not self.armed:
            self.reason = f"{name} outside the step loop (after step {self.step})"
            raise KeyboardInterrupt(self.reason)
        if self.requested:
            self.reason = (
                self._grace_over or f"{name} during step {self.step + 1}: a second signal abandoned it"
            )
            raise KeyboardInterrupt(self.reason)
        self.signum = signum
        grace = f"at most {self.grace_s:g}s" if self.grace_s is not None else "however long it takes"
        logger.warning(
            "%s received during step %d: finishing it (%s, stop_grace_s), then writing a checkpoint and exiting "
            "(send it again to abandon the step)",
            name, self.step + 1, grace,
        )  # fmt: skip
        if self.grace_s is not None:
            self._timer = threading.Timer(self.grace_s, self._abandon, args=(signum, self.step))
            self._timer.daemon = True
            self._timer.start()

    def step_finished(self) -> None:
        """The step the grace was running for is done: its checkpoint must not be cut short."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _abandon(self, signum: int, step: int) -> None:
        """Grace over (timer thread): interrupt the main thread, wherever it waits, with the reason."""
        if not self.armed or self.step != step:
            return  # the step finished in time; the loop is checkpointing or gone
        name = signal.Signals(signum).name
        self._grace_over = (
            f"{name} during step {step + 1}: it did not finish within stop_grace_s={self.grace_s:g}s of the "
            "signal (a call may be stuck), so it was abandoned"
        )
        logger.error("%s", self._grace_over)
        signal.pthread_kill(threading.main_thread().ident or 0, signum)  # runs handle(): raises there

    def reinstall(self) -> None:
        """Take the signals back: ``ray.init`` installs its own SIGTERM handler in the driver (which aborts)."""
        if threading.current_thread() is threading.main_thread():
            for sig in _STOP_SIGNALS:
                signal.signal(sig, self.handle)

    @contextmanager
    def installed(self) -> Iterator[StopSignals]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
        self.reinstall()
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@dataclass(frozen=True)
class LostWorker:
    """An actor whose process is gone: its role, rank and the cause Ray reports."""

    role: str
    rank: int
    cause: str

    def __str__(self) -> str:
        return f"{self.role} rank {self.rank} died: {self.cause}"


def find_lost_worker(clusters: Sequence[Any]) -> LostWorker | None:
    """Ping every actor of every cluster (``Cluster.actors``); the first dead one, else ``None``.

    A live actor that is busy (say, stuck in a collective whose peer died) does not answer within the ping
    timeout and counts as alive: only Ray's own verdict that an actor is dead counts.
    """
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    from roll.core.cluster.calls import CallTarget, translate_error

    pings = [
        (cluster.role, rank, actor.get_info.remote())
        for cluster in clusters
        for rank, actor in enumerate(cluster.actors)
    ]
    deadline = (
        time.monotonic() + _PING_TIMEOUT_S
    )  # one deadline for all: hung actors cost 10 s in all, not each
    for role, rank, ref in pings:
        try:
            ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
        except RayActorError as exc:
            error = translate_error(exc, CallTarget(role, "get_info", _PING_TIMEOUT_S), rank)
            cause = str(error).split(": ", 2)[-1]
            return LostWorker(role, rank, cause)
        except (GetTimeoutError, ray.exceptions.RayError):
            continue  # alive but busy, or a task error: not a lost process
    return None


__all__ = ["EXIT_PREEMPTED", "LostWorker", "Preempted", "StopSignals", "find_lost_worker"]
