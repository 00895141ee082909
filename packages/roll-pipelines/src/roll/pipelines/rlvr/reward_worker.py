"""Reward workers: Ray actors around the ``roll.reward`` plugins, one cluster per reward domain.

A worker builds its reward function once (``spec.build(spec.config_model(**options))``), then scores batches of
generated rows off the training path: the :class:`~roll.core.scheduler.RewardScheduler` submits each request's
samples as soon as they are generated, so scoring overlaps the next generation. Rewards that can hang (math-verify,
the code sandbox) enforce their own timeouts; a bad *response* scores 0 with the reason in ``info``.

The worker takes and returns plain lists (the scheduler is built with ``columns=REWARD_COLUMNS``), and this module
imports no torch: a text reward's process stays at ~100 MB instead of ~650 and starts in a second or two. A reward
plugin that needs torch (a reward model) imports it in its own ``build``.

Columns read (:data:`REWARD_COLUMNS`): ``text`` (the decoded response), ``ground_truth``, optional ``prompt``,
``tag``. Written: ``scores_B`` and ``correct_B`` (1.0 when the reward's ``info`` says the answer is correct, else
the score clipped to [0, 1]; the accuracy metric), ``reward_error_B`` (1.0 when the reward could not score the
row: :meth:`~roll.pipelines.rewards.types.RewardResult.unscored`), which the scheduler makes float32 tensors, and
``reward_error_report`` (an :class:`~roll.core.failures.ErrorReport` naming the reward, the row and the value or
exception, or None). Every result is checked here, whatever the plugin: an exception from ``score``, a NaN, an
infinity or a value that is not a number leaves the row unscored instead of reaching the advantages.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

from roll.core import columns as C
from roll.core import plugins
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.core.failures import ErrorReport
from roll.pipelines.rewards.python import to_result
from roll.pipelines.rewards.types import UNSCORED, RewardFunction, RewardRequest, RewardResult

__all__ = ["REWARD_COLUMNS", "RewardWorker", "timed_out_rows"]

REWARD_COLUMNS = (C.TEXT, C.PROMPT, C.GROUND_TRUTH, C.TAG)
"""The columns a reward worker gets; pass as ``RewardScheduler(columns=...)``."""

Rows = dict[str, list[Any]]


class RewardWorker(Worker):
    """Scores rows with the ``roll.reward`` plugin ``reward_type`` built from ``options``."""

    def __init__(self, ctx: WorkerContext, reward_type: str, options: dict[str, Any]) -> None:
        super().__init__(ctx)
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # for a plugin that brings torch along
        spec = plugins.load("roll.reward", reward_type)
        config = spec.config_model(**options) if spec.config_model is not None else None
        self.reward: RewardFunction = spec.build(config)  # None when the spec has no config model
        domain = ctx.role.removeprefix("reward_")
        self.source = f"reward {domain}" + (f" ({reward_type})" if reward_type != domain else "")
        self._traced: set[str] = set()  # kinds whose traceback this worker has sent (the driver shows one)

    @register(Dispatch.RANK_ZERO)  # the RewardScheduler sends each rank its share itself
    def score(self, rows: Rows) -> dict[str, list[Any]]:
        """``scores_B``, ``correct_B``, ``reward_error_B``, ``reward_error_report`` and ``reward_answer`` of every
        row, in order."""
        n = len(next(iter(rows.values()), []))
        requests = [_request(rows, i) for i in range(n)]
        results = checked_results(self.reward, requests, self.source)
        return {
            C.SCORES: [float(r.score) for r in results],
            C.CORRECT: [_correct(r) for r in results],
            C.REWARD_ERROR: [float(r.is_unscored) for r in results],
            C.REWARD_ERROR_REPORT: [self._report(r, q) for r, q in zip(results, requests)],
            C.REWARD_ANSWER: [_answer(r) for r in results],
        }

    def _report(self, result: RewardResult, request: RewardRequest) -> ErrorReport | None:
        """The row's error report, with the traceback only the first time this worker meets its kind."""
        if not result.is_unscored:
            return None
        kind = str(result.info[UNSCORED])
        trace = result.info.get("traceback") if kind not in self._traced else None
        self._traced.add(kind)
        return ErrorReport(self.source, kind, f"{result.info['error']} [{_row(request)}]", trace)


def checked_results(reward: RewardFunction, requests: list[RewardRequest], where: str) -> list[RewardResult]:
    """``reward.score(requests)``, every result checked: a ``score`` that raises leaves every row unscored (with
    the traceback), a wrong count or a result that is not a finite number leaves its rows unscored, each naming
    ``where`` and the value. Plugins other than ``python`` get the same contract as user functions."""
    try:
        results = list(reward.score(requests))
    except Exception as exc:  # a reward plugin's bug: these rows are unscored, the run's error rate decides
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        failed = RewardResult.unscored(
            f"{where} raised {type(exc).__name__}: {exc}", kind=type(exc).__name__, traceback=text
        )
        return [failed] * len(requests)
    if len(results) != len(requests):
        error = f"{where} returned {len(results)} results for {len(requests)} rows"
        return [RewardResult.unscored(error, kind="invalid value")] * len(requests)
    return [to_result(r, where) for r in results]


def _row(request: RewardRequest) -> str:
    def short(text: str) -> str:
        return repr(text if len(text) <= 60 else text[:57] + "...")

    parts = [f"prompt {short(request.prompt)}", f"response {short(request.response)}"]
    parts.append(f"ground truth {short(request.ground_truth)}")
    return "row: " + ", ".join(parts)


def timed_out_rows(domain: str, n: int, reason: str) -> dict[str, list[Any]]:
    """What :meth:`RewardWorker.score` would answer for ``n`` rows of ``domain`` it could not score: the columns
    the :class:`~roll.core.scheduler.RewardScheduler` gives a share whose call passed its deadline
    (``on_timeout``): score 0, not correct, ``reward_error_B`` 1, and a ``timeout`` report with the reason (no
    traceback: the call was abandoned, not raised)."""
    report = ErrorReport(f"reward {domain}", "timeout", reason)
    return {
        C.SCORES: [0.0] * n,
        C.CORRECT: [0.0] * n,
        C.REWARD_ERROR: [1.0] * n,
        C.REWARD_ERROR_REPORT: [report] * n,
        C.REWARD_ANSWER: [None] * n,
    }


def _request(rows: Rows, i: int) -> RewardRequest:
    def text(column: str) -> str:
        value = rows[column][i] if column in rows else None
        return str(value) if value is not None else ""

    return RewardRequest(
        response=text(C.TEXT), prompt=text(C.PROMPT), ground_truth=text(C.GROUND_TRUTH), tag=text(C.TAG)
    )


def _answer(result: RewardResult) -> str | None:
    """The extracted answer a reward reports in ``info["answer"]`` (as text), else None."""
    answer = result.info.get("answer")
    return None if answer is None else str(answer)


def _correct(result: RewardResult) -> float:
    if "correct" in result.info:
        return float(bool(result.info["correct"]))
    return min(max(result.score, 0.0), 1.0)
