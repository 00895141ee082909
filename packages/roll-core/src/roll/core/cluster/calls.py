"""A call in flight on some ranks of a Cluster, and the translation of Ray's failures into roll's errors.

:class:`PendingCall` is what ``cluster.method.submit(...)`` returns: ``.result(timeout)`` blocks, ``await call``
works in asyncio (the wait runs in a thread, so the event loop keeps going), ``.done()`` polls. The call's deadline
is fixed when it is submitted (submit time + the method's timeout); past it, the call fails with
:class:`WorkerTimeoutError` naming the ranks that did not answer. Ranks are waited for as they finish, so one
failing rank is reported at once rather than after the slowest.

Ray wraps a remote exception in ``RayTaskError`` and a dead actor in ``RayActorError``; both are turned into a
:class:`WorkerError` whose message names role, rank and method and carries the original exception's type and
message plus the user-code part of the remote traceback. The full remote traceback stays on
``err.remote_traceback``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

from roll.core.cluster.dispatch import CallPlan, DispatchRule
from roll.core.errors import WorkerError, WorkerTimeoutError

R_co = TypeVar("R_co", covariant=True)

__all__ = ["CallTarget", "PendingCall", "translate_error"]

_TRACEBACK_LINES = 12
_DEATH_CAUSE = re.compile(r"kill|exit|memory|OOM|preempt|node.*(died|dead)|reason", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class CallTarget:
    """What a pending call is, for error messages: role, method name and the timeout that applies."""

    role: str
    method: str
    timeout_s: float


class PendingCall(Generic[R_co]):
    """A submitted cluster call whose collected result is an ``R_co``. See the module docstring."""

    def __init__(
        self, target: CallTarget, plan: CallPlan, rule: DispatchRule, refs: list[ray.ObjectRef[Any]]
    ) -> None:
        self.target = target
        self._plan = plan
        self._rule = rule
        self._deadline = time.monotonic() + target.timeout_s
        self._pending: dict[ray.ObjectRef[Any], int] = dict(zip(refs, plan.ranks))
        self._results: dict[int, Any] = {}
        self._value: Any = None
        self._finished = False

    def done(self) -> bool:
        """True when every rank has answered (successfully or not); never blocks."""
        if not self._pending:
            return True
        _, not_ready = ray.wait(list(self._pending), num_returns=len(self._pending), timeout=0)
        return not not_ready

    def result(self, timeout: float | None = None) -> R_co:
        """The collected result. Waits until the call's deadline, or at most ``timeout`` seconds when given.

        Raises :class:`WorkerError` for a failed rank or dead actor, :class:`WorkerTimeoutError` when the deadline
        (or ``timeout``) passes first. After a ``timeout`` shorter than the deadline the call is still live and
        ``result`` may be called again.
        """
        if self._finished:
            value: R_co = self._value
            return value
        wait_until = self._deadline if timeout is None else min(self._deadline, time.monotonic() + timeout)
        while self._pending:
            left = max(wait_until - time.monotonic(), 0.0)
            ready, _ = ray.wait(list(self._pending), num_returns=1, timeout=left)
            if not ready:  # read late is not late: only a rank still silent now has missed the deadline
                raise self._timeout_error(expired=wait_until >= self._deadline, waited=timeout)
            for ref in ready:
                rank = self._pending.pop(ref)
                self._results[rank] = self._get(ref, rank)
        self._value = self._rule.collect([self._results[r] for r in self._plan.ranks], self._plan)
        self._finished = True
        collected: R_co = self._value
        return collected

    def __await__(self) -> Generator[Any, None, R_co]:
        return asyncio.to_thread(self.result).__await__()

    def _get(self, ref: ray.ObjectRef[Any], rank: int) -> Any:
        try:
            return ray.get(ref, timeout=max(1.0, self._deadline - time.monotonic()))
        except (RayError, GetTimeoutError) as exc:
            raise translate_error(exc, self.target, rank) from None

    def _timeout_error(self, *, expired: bool, waited: float | None) -> WorkerTimeoutError:
        t = self.target
        late = sorted(self._pending.values())
        answered = sorted(self._results)
        if expired:
            for ref in self._pending:
                _cancel(ref)
            budget = f"within {t.timeout_s:g}s"
            hint = (
                "the actor may be hung, deadlocked in a collective, or dead. If the work is legitimately slow, "
                f"raise @register(timeout_s=...) or {t.role}.call_timeout_s"
            )
        else:
            budget = (
                f"within the {waited:g}s waited (the call's own {t.timeout_s:g}s deadline has not passed)"
            )
            hint = "call result() again to keep waiting"
        return WorkerTimeoutError(
            f"{t.role} rank {late[0]}: {t.method} did not answer {budget}; ranks not answered: {late}, "
            f"answered: {answered}. {hint}",
            role=t.role,
            rank=late[0],
            method=t.method,
            timeout_s=t.timeout_s,
        )


def translate_error(exc: BaseException, target: CallTarget, rank: int) -> WorkerError:
    """A :class:`WorkerError` (or :class:`WorkerTimeoutError`) that names role, rank and method."""
    where = f"{target.role} rank {rank}"
    if isinstance(exc, GetTimeoutError):
        return WorkerTimeoutError(
            f"{where}: {target.method} did not answer within {target.timeout_s:g}s",
            role=target.role,
            rank=rank,
            method=target.method,
            timeout_s=target.timeout_s,
        )
    if isinstance(exc, RayTaskError):
        cause = exc.cause
        summary = f"{type(cause).__name__}: {cause}" if cause is not None else exc.function_name
        # ray.get raises a "dual" subclass of RayTaskError and the user's exception type whose attributes forward
        # to the cause, so traceback_str is only in __dict__ on a plain RayTaskError; str() carries it on both.
        full_trace = str(exc.__dict__.get("traceback_str") or str(exc))
        trace = _user_traceback(full_trace)
        message = (
            f"{where}: {target.method} raised {summary}\nremote traceback (most recent call last):\n{trace}"
        )
        remote_type = type(cause).__name__ if cause is not None else "RayTaskError"
        return WorkerError(
            message, role=target.role, rank=rank, method=target.method, remote_type=remote_type,
            remote_traceback=full_trace,
        )  # fmt: skip
    if isinstance(exc, RayActorError):
        method = "__init__" if exc.actor_init_failed else target.method
        detail = _death_summary(str(exc))
        message = f"{where}: {method} failed because the actor is dead or unreachable: {detail}"
        return WorkerError(
            message, role=target.role, rank=rank, method=method, remote_type=type(exc).__name__,
            remote_traceback=str(exc),
        )  # fmt: skip
    message = f"{where}: {target.method} failed in Ray: {type(exc).__name__}: {_first_lines(str(exc), 6)}"
    return WorkerError(
        message, role=target.role, rank=rank, method=target.method, remote_type=type(exc).__name__,
        remote_traceback=str(exc),
    )  # fmt: skip


def _user_traceback(traceback_str: str) -> str:
    """The remote traceback without Ray's banner, colour codes, caret lines or Ray's own frames; last lines only."""
    kept: list[str] = []
    skip_body = False
    for line in _clean_lines(traceback_str):
        if line.startswith("ray::") or set(line.strip()) <= {"^", "~"}:
            continue
        if line.lstrip().startswith("File "):
            skip_body = "/site-packages/ray/" in line
            if skip_body:
                continue
        elif skip_body and line.startswith("    "):
            continue
        kept.append(line)
    return "\n".join(kept[-_TRACEBACK_LINES:])


def _clean_lines(text: str) -> list[str]:
    return [ln for ln in _ANSI.sub("", text).splitlines() if ln.strip()]


def _death_summary(text: str) -> str:
    """Ray's actor-death text is long (ids, pids, ...); keep the first line, the cause and the user traceback."""
    lines = _clean_lines(text)
    head = lines[:1]
    why = [ln.strip() for ln in lines[1:] if _DEATH_CAUSE.search(ln) and "actor_id" not in ln]
    trace = (
        _user_traceback("\n".join(lines[1:]))
        if any("Traceback" in ln or "File " in ln for ln in lines)
        else ""
    )
    return "\n".join([*head, *why[:3], *([trace] if trace else [])])


def _first_lines(text: str, n: int) -> str:
    lines = [ln for ln in _clean_lines(text) if set(ln.strip()) - {"^", "~"}]
    return "\n".join(lines[:n]) + ("\n..." if len(lines) > n else "")


def _cancel(ref: ray.ObjectRef[Any]) -> None:
    """Best effort: a queued task is dropped; a running one in a regular actor keeps running (Ray's rule)."""
    with contextlib.suppress(Exception):  # cancellation is a courtesy; the timeout error is what matters
        ray.cancel(ref)
