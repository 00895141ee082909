"""Loud failures: user-code exceptions shown once, error rates and stop conditions that end a run non-zero.

Every call into user code (a reward, an env, a tool) that fails is turned into an :class:`ErrorReport` where it
ran (often a Ray actor) and carried back to the driver with the rows it concerns. The driver's
:class:`FailureGuard` then:

- **shows** the first report of each kind (per source and exception type) with its full traceback, at ERROR on
  the driver's ``roll`` logger (so it reaches the terminal, not only an actor's log); later ones of that kind are
  only counted;
- **watches** each step's metrics and stops the run with :class:`RunStopped` (a :class:`RollError`: ``roll
  train`` prints one message and exits 1) when

  * an error rate (a metric ``<source>/errors``: the fraction of the step's rows or episodes whose reward, env or
    tool failed) averaged over the last ``failures.error_window`` steps exceeds ``failures.max_error_rate``. The
    verdict waits until the window is full (one bad step early on is not a trend) and is taken once more at the
    end of the run over every step it had, so a run shorter than the window cannot end "done" above the limit;
  * a loss or gradient norm (``<role>/loss``, ``<role>/value_loss``, ``<role>/grad_norm``) is NaN or infinite
    (the RL pipelines' policy group checks each rank's numbers first and names role and rank), unless
    ``failures.non_finite`` is ``skip`` (the strategies drop such an update and leave the weights as they were);
  * ``failures.max_steps_without_update`` steps in a row made no useful optimizer update (the RL pipelines
    report ``actor/updates``: optimizer steps that had at least one row with a gradient and a finite norm): nothing
    was trained (no sample survived), every row's advantage was zero, or the update was skipped as non-finite. A
    step that reports no ``<role>/updates`` at all (a critic warm-up step, a mode without policy updates) is not
    judged.

Why a zero-advantage step counts as "no update": its optimizer step runs, but with a zero gradient; one such step
is normal (every sample of every prompt scored the same), but many in a row mean the reward gives no signal (a
constant or broken reward, a task far too hard or already solved) and the run is learning nothing, which is
exactly what must not end "done" with exit 0. The message then says which it was.

Pure Python (no torch, no Ray): tests drive it with plain dicts.
"""

from __future__ import annotations

import logging
import math
import traceback
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from roll.core.config.sections import FailureConfig
from roll.core.errors import RollError

__all__ = [
    "ErrorReport",
    "FailureConfig",
    "FailureGuard",
    "RunStopped",
    "report_exception",
]

logger = logging.getLogger("roll.failures")

ERRORS_SUFFIX = "/errors"
UPDATES_SUFFIX = "/updates"
NON_FINITE_NAMES = ("loss", "grad_norm")


class RunStopped(RollError, RuntimeError):
    """The run cannot learn: an error rate over the limit, a non-finite loss or gradient, or no updates."""


@dataclass(frozen=True)
class ErrorReport:
    """One failure of user code: ``source`` (``reward math``, ``env sokoban``), ``kind`` (the exception type, or
    ``invalid value`` / ``timeout``), a one-line ``message`` naming the row and value, and the ``traceback`` text
    when an exception was raised. Plain and picklable: it travels from actors to the driver."""

    source: str
    kind: str
    message: str
    traceback: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.source, self.kind)


def report_exception(source: str, exc: BaseException, message: str | None = None) -> ErrorReport:
    """An :class:`ErrorReport` of ``exc`` with its full traceback (call it in the ``except`` block)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return ErrorReport(source, type(exc).__name__, message or f"{type(exc).__name__}: {exc}", text)


class FailureGuard:
    """The driver's side of :mod:`roll.core.failures`: :meth:`show` reports, :meth:`observe` each step's metrics,
    :meth:`finish` at the end of the run."""

    def __init__(self, config: FailureConfig | None = None) -> None:
        self.config = config or FailureConfig()
        self.shown: set[tuple[str, str]] = set()
        self.first_error: dict[str, str] = {}  # metric prefix ("reward", "env") -> the first message seen
        self.counts: dict[tuple[str, str], int] = {}
        self._rates: dict[str, deque[float]] = {}
        self._all_rates: dict[str, list[float]] = {}
        self._without_update = 0
        self._last_cause = ""

    # ------------------------------------------------------------------------------------------ reports

    def show(self, reports: Iterable[ErrorReport | None]) -> int:
        """Log the first report of each (source, kind) with its traceback; count every one. Returns how many
        were shown now."""
        shown = 0
        for report in reports:
            if report is None:
                continue
            self.counts[report.key] = self.counts.get(report.key, 0) + 1
            self.first_error.setdefault(report.source.split(" ", 1)[0], f"{report.source}: {report.message}")
            if report.key in self.shown:
                continue
            self.shown.add(report.key)
            shown += 1
            tail = f"\n{report.traceback.rstrip()}" if report.traceback else ""
            logger.error(
                "%s failed (%s): %s%s\n(shown once; later %s errors of %s are counted in %s/errors)",
                report.source, report.kind, report.message, tail, report.kind, report.source,
                report.source.split(" ", 1)[0],
            )  # fmt: skip
        return shown

    # ------------------------------------------------------------------------------------------ per step

    def observe(self, step: int, metrics: Mapping[str, float]) -> None:
        """Check step ``step``'s metrics (1-based: the number of completed steps); raise :class:`RunStopped`."""
        self._check_non_finite(step, metrics)
        for name, value in metrics.items():
            if _is_error_rate(name):
                self._rates.setdefault(name, deque(maxlen=self.config.error_window)).append(float(value))
                early = self._all_rates.setdefault(name, [])
                if len(early) < self.config.error_window:  # only a run shorter than the window needs them all
                    early.append(float(value))
        for name, window in self._rates.items():
            if len(window) == self.config.error_window:
                self._check_rate(name, list(window), step)
        self._check_updates(step, metrics)

    def finish(self, step: int) -> None:
        """The end-of-run verdict for runs shorter than the window: the error rate over every step they had."""
        for name, rates in self._all_rates.items():
            if 0 < len(rates) < self.config.error_window:
                self._check_rate(name, rates, step)

    def _check_rate(self, name: str, rates: list[float], step: int) -> None:
        mean = sum(rates) / len(rates)
        limit = self.config.max_error_rate
        if mean <= limit or limit >= 1.0:
            return
        source = name.removesuffix(ERRORS_SUFFIX)
        first = self.first_error.get(source, "(no error report reached the driver)")
        raise RunStopped(
            f"stopped after step {step}: {name} averaged {mean:.2f} over the last {len(rates)} steps "
            f"(max_error_rate {limit:g}): {source} calls keep failing. First error: {first}. "
            "Fix the cause (its traceback is above), or raise failures.max_error_rate"
        )

    def _check_non_finite(self, step: int, metrics: Mapping[str, float]) -> None:
        bad = {k: v for k, v in metrics.items() if _is_training_number(k) and not math.isfinite(float(v))}
        if not bad:
            return
        shown = ", ".join(f"{k} = {v}" for k, v in sorted(bad.items()))
        role = sorted(bad)[0].split("/", 1)[0]
        if self.config.non_finite == "skip":
            logger.warning("step %d: %s; the update was skipped (failures.non_finite: skip)", step, shown)
            return
        raise RunStopped(
            f"stopped at step {step}: a non-finite loss or gradient in role {role!r} ({shown}); the update was "
            "not applied. Look for NaN/inf rewards or advantages, a too high learning rate, or an overflow; "
            "failures.non_finite: skip drops such updates and goes on"
        )

    def _check_updates(self, step: int, metrics: Mapping[str, float]) -> None:
        limit = self.config.max_steps_without_update
        updates = [v for k, v in metrics.items() if k.endswith(UPDATES_SUFFIX) and k.count("/") == 1]
        if not updates:
            return  # a pipeline (or a step: a critic warm-up) that reports no policy updates: nothing to judge
        if any(u > 0 and math.isfinite(u) for u in updates):
            self._without_update = 0
            return
        self._without_update += 1
        self._last_cause = _no_update_cause(metrics)
        if limit and self._without_update >= limit:
            raise RunStopped(
                f"stopped after step {step}: no useful optimizer update in the last {self._without_update} steps "
                f"({self._last_cause}); the run is learning nothing. Raise failures.max_steps_without_update, or "
                "0 to never stop"
            )


def _is_error_rate(name: str) -> bool:
    return name.endswith(ERRORS_SUFFIX) and name.count("/") == 1


def _is_training_number(name: str) -> bool:
    """``actor/loss``, ``critic/value_loss``, ``actor/grad_norm``: a loss or a gradient norm of a trained role."""
    prefix, _, last = name.rpartition("/")
    return bool(prefix) and "/" not in prefix and prefix != "eval" and last.endswith(NON_FINITE_NAMES)


def _no_update_cause(metrics: Mapping[str, float]) -> str:
    if metrics.get("samples", 1.0) == 0:
        return "no sample to train on: every episode or row was dropped or filtered"
    if any(_is_training_number(k) and not math.isfinite(float(v)) for k, v in metrics.items()):
        return "the update was skipped as non-finite"
    std = metrics.get("reward/std")
    spread = f" (reward/std {std:.3g})" if std is not None else ""
    return f"every row's advantage was 0: all samples of each group scored the same{spread}; is the reward constant?"
