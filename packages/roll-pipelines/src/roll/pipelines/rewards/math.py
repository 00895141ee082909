"""Math reward: math-verify equivalence of the final ``\\boxed{}`` answer, plus an optional format reward.

Answer extraction: the text after the last ``</think>`` (the whole response when there is none), then the content
of its last ``\\boxed{...}`` (braces matched). Without a box, ``no_box`` decides:

- ``last_line`` (default): the last non-empty line is the answer, taken whole: an ``The answer is``/``Answer:``
  lead-in, ``$...$``/``\\(...\\)`` delimiters and a final period are stripped, and the rest is judged as if it
  were boxed. So ``The answer is 16.`` scores for 16, while ``I got 18, no, 16`` or ``xx 18 yy 16>`` do not.
- ``zero``: no box, no score (``info["error"] = "no boxed answer"``).
- ``anywhere``: math-verify's own extraction over the whole text, which picks the *last* number or expression it
  finds: a response that merely contains the right number at the end scores (the old behaviour).

With ``bare_answer`` (default), an answer (boxed or last line) that holds plain words (two or more letters that
are not a LaTeX command, the inside of ``\\text{}`` or a function name such as ``sqrt``) scores 0 with
``info["error"] = "not a bare answer"``: math-verify would otherwise read ``\\boxed{xx 18 yy 16}`` as 16.

Why a process pool: math-verify bounds its sympy work with ``signal.alarm``, which raises off the main thread
(and reward workers call us from threads). So we call ``parse``/``verify`` with their timeouts disabled and
enforce our own: every item runs in a worker of a ``ProcessPoolExecutor``; an item still running after
``timeout_s`` scores 0 with ``error="timeout"`` and the pool's workers are killed (a stuck sympy call cannot be
interrupted any other way), the other in-flight items are resubmitted to a fresh pool. At most ``num_workers``
items are in flight, so an item's deadline starts when a worker takes it. The ``forkserver`` start method keeps
forking safe in a threaded parent and warms math-verify once, in the server
(see :mod:`roll.pipelines.rewards._math_worker`).
"""

from __future__ import annotations

import multiprocessing
import re
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from roll.core.errors import WorkerError
from roll.pipelines.rewards._math_worker import Outcome, verify_answer, warm
from roll.pipelines.rewards.config import MathRewardConfig
from roll.pipelines.rewards.types import RewardRequest, RewardResult

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_LEAD_IN = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is\s*:?|:)\s*", re.IGNORECASE)
_DELIMITED = re.compile(r"^(?:\$\$?(?P<a>.*?)\$\$?|\\\((?P<b>.*?)\\\)|\\\[(?P<c>.*?)\\\])$", re.DOTALL)
_TEXT = re.compile(r"\\(?:text|mathrm|textbf|mbox|operatorname)\s*\{[^{}]*\}")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_FUNCTIONS = frozenset(
    {"sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp", "sqrt", "pi", "inf", "oo"}
)
_FORMAT = re.compile(r"\s*<think>.*?</think>\s*\S", re.DOTALL)
_WARMUP_TIMEOUT_S = 120.0
_MAX_RESUBMITS = 2


def final_answer_text(response: str, think_end: str = "</think>") -> str:
    """The part of ``response`` after the last ``think_end`` (all of it when the tag is absent)."""
    _, sep, tail = response.rpartition(think_end)
    return tail if sep else response


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` with nested braces matched, or ``None``."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i]
    return None


def last_line_answer(text: str) -> str | None:
    """The last non-empty line of ``text`` as a bare answer: lead-in, math delimiters and final period stripped."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    answer = _LEAD_IN.sub("", lines[-1]).rstrip(".").strip()
    delimited = _DELIMITED.match(answer)
    if delimited:
        answer = next(group for group in delimited.groups() if group is not None).strip()
    return answer.rstrip(".").strip() or None


def is_bare(answer: str) -> bool:
    """Whether ``answer`` holds no plain words: only math, LaTeX commands, ``\\text{}`` and function names.

    A word is three or more letters in a row (not a LaTeX command), or two standing alone between spaces: so
    ``2ab`` is a product, ``xx 18 yy 16`` is not an answer."""
    text = _TEXT.sub(" ", answer)
    for match in _WORD.finditer(text):
        word, start, end = match.group(), match.start(), match.end()
        alone = (start == 0 or text[start - 1].isspace()) and (end == len(text) or text[end].isspace())
        if (len(word) >= 3 or alone) and word.lower() not in _FUNCTIONS:
            return False
    return True


def has_think_format(response: str, think_end: str = "</think>") -> bool:
    """Whether ``response`` is ``<think>...</think>`` followed by a non-empty answer."""
    if think_end != "</think>":
        return think_end in response and bool(final_answer_text(response, think_end).strip())
    return _FORMAT.match(response) is not None


class _KillablePool:
    """A ``ProcessPoolExecutor`` that enforces a per-item deadline by killing and replacing its workers."""

    def __init__(self, num_workers: int, start_method: str, timeout_s: float) -> None:
        self.num_workers, self.timeout_s = num_workers, timeout_s
        self._ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(["roll.pipelines.rewards._math_warmup"])
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.restarts = 0

    def _ensure(self) -> ProcessPoolExecutor:
        if self._pool is not None and getattr(self._pool, "_broken", False):
            self._kill()  # a worker died (e.g. out of memory): start over with a fresh pool
        if self._pool is None:
            pool = ProcessPoolExecutor(self.num_workers, mp_context=self._ctx, initializer=warm)
            # Start every worker before any deadline runs, so start-up time is never charged to an item.
            warmups = [pool.submit(time.sleep, 0) for _ in range(self.num_workers)]
            done, _ = wait(warmups, timeout=_WARMUP_TIMEOUT_S)
            failed = [f.exception() for f in done if f.exception() is not None]
            if failed or len(done) < len(warmups):
                pool.shutdown(wait=False, cancel_futures=True)
                raise WorkerError(
                    f"math reward: its {self.num_workers} worker processes ({self._ctx.get_start_method()}) "
                    f"did not start within {_WARMUP_TIMEOUT_S:.0f}s: {failed[:1] or 'timed out'}. A script that "
                    "builds the reward at import time needs an `if __name__ == '__main__':` guard."
                )
            self._pool = pool
        return self._pool

    def _kill(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()
        pool.shutdown(wait=True, cancel_futures=True)
        self.restarts += 1

    def close(self) -> None:
        with self._lock:
            self._kill()

    def run(self, jobs: list[tuple[str, str]]) -> list[Outcome]:
        """Outcomes of ``verify_answer(*job)`` in job order; a job past its deadline gives ``(False, "timeout")``."""
        with self._lock:
            return _Run(self, jobs).execute()


class _Run:
    """One batch through a :class:`_KillablePool`: keeps ``num_workers`` items in flight, each with a deadline."""

    def __init__(self, owner: _KillablePool, jobs: list[tuple[str, str]]) -> None:
        self.owner, self.jobs = owner, jobs
        self.pending: deque[int] = deque(range(len(jobs)))
        self.in_flight: dict[Future[Outcome], tuple[int, float]] = {}
        self.results: dict[int, Outcome] = {}
        self.resubmits: dict[int, int] = {}

    def execute(self) -> list[Outcome]:
        while self.pending or self.in_flight:
            self._fill()
            earliest = min(deadline for _, deadline in self.in_flight.values())
            done, _ = wait(
                self.in_flight, timeout=max(0.0, earliest - time.monotonic()), return_when=FIRST_COMPLETED
            )
            for future in done:
                self._collect(future)
            self._expire()
        return [self.results[i] for i in range(len(self.jobs))]

    def _fill(self) -> None:
        pool = self.owner._ensure()
        while self.pending and len(self.in_flight) < self.owner.num_workers:
            index = self.pending.popleft()
            future = pool.submit(verify_answer, *self.jobs[index])
            self.in_flight[future] = (index, time.monotonic() + self.owner.timeout_s)

    def _collect(self, future: Future[Outcome]) -> None:
        index, _ = self.in_flight.pop(future)
        try:
            self.results[index] = future.result()
        except BrokenProcessPool:
            self._requeue(index)
        except Exception as exc:  # a math-verify bug on one input must not fail the batch
            self.results[index] = (False, f"{type(exc).__name__}: {exc}")

    def _requeue(self, index: int) -> None:
        self.resubmits[index] = self.resubmits.get(index, 0) + 1
        if self.resubmits[index] > _MAX_RESUBMITS:
            self.results[index] = (False, "worker crashed")
        else:
            self.pending.appendleft(index)

    def _expire(self) -> None:
        now = time.monotonic()
        expired = [f for f, (_, deadline) in self.in_flight.items() if deadline <= now and not f.done()]
        if not expired:
            return
        for future in expired:
            index, _ = self.in_flight.pop(future)
            self.results[index] = (False, "timeout")
        for future, (index, _) in list(self.in_flight.items()):  # bystanders: keep finished, rerun the rest
            if future.done():
                self._collect(future)
            else:
                self.in_flight.pop(future)
                self.pending.appendleft(index)
        self.owner._kill()


class MathReward:
    """``score = correct_weight * correct + format_weight * format``; see the module docstring for extraction.

    Holds a process pool: call :meth:`close` (or use as a context manager) when done.
    """

    def __init__(self, config: MathRewardConfig | None = None) -> None:
        self.config = config or MathRewardConfig()
        self._pool = _KillablePool(self.config.num_workers, self.config.start_method, self.config.timeout_s)

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        answers = [self.answer(r.response) for r in requests]
        todo = [i for i, (prediction, _, _) in enumerate(answers) if prediction is not None]
        outcomes = self._pool.run([(str(answers[i][0]), requests[i].ground_truth) for i in todo])
        verdicts: list[Outcome] = [(False, reason) for _, _, reason in answers]
        for index, outcome in zip(todo, outcomes):
            verdicts[index] = outcome
        return [self._result(r, a[1], v) for r, a, v in zip(requests, answers, verdicts)]

    def answer(self, response: str) -> tuple[str | None, str | None, str | None]:
        """(what math-verify parses or ``None`` when nothing is judged, the answer shown in ``info``, why none)."""
        final = final_answer_text(response, self.config.think_end)
        answer = last_boxed(final)
        if answer is None:
            if self.config.no_box == "anywhere":
                return final, None, None
            if self.config.no_box == "zero":
                return None, None, "no boxed answer"
            answer = last_line_answer(final)
            if answer is None:
                return None, None, "no answer"
        if self.config.bare_answer and not is_bare(answer):
            return None, answer, "not a bare answer"
        return "\\boxed{" + answer + "}", answer, None

    def _result(self, request: RewardRequest, answer: str | None, outcome: Outcome) -> RewardResult:
        correct, error = outcome
        fmt = has_think_format(request.response, self.config.think_end)
        score = self.config.correct_weight * correct + self.config.format_weight * fmt
        info: dict[str, Any] = {"correct": correct, "format": fmt, "answer": answer}
        if error is not None:
            info["error"] = error
        return RewardResult(score=score, info=info)

    @property
    def restarts(self) -> int:
        """How many times stuck workers were killed (a metric worth logging)."""
        return self._pool.restarts

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> MathReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
