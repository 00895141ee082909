"""The driver's failure guard (:mod:`roll.core.failures`): user-code errors shown once, error rates over a window,
non-finite losses and gradients, steps without updates. Plain dicts of metrics, as pipelines log them."""

from __future__ import annotations

import logging
import math

import pytest

from roll.core.config.sections import FailureConfig
from roll.core.failures import ErrorReport, FailureGuard, RunStopped, report_exception


def _healthy(step: int) -> dict[str, float]:
    return {"reward/errors": 0.0, "actor/loss": 0.1 * step, "actor/grad_norm": 1.0, "actor/updates": 1.0}


def test_a_healthy_run_never_stops() -> None:
    guard = FailureGuard()
    for step in range(1, 60):
        guard.observe(step, _healthy(step))
    guard.finish(59)


def test_error_rate_over_the_window_stops_with_the_first_error() -> None:
    """Window 3, limit 0.5: rates 1, 1 wait for the window; the third step's mean (1 + 1 + 0) / 3 = 0.67 > 0.5
    stops, naming the metric, the mean, the limit and the first error shown."""
    guard = FailureGuard(FailureConfig(max_error_rate=0.5, error_window=3))
    guard.show(
        [ErrorReport("reward nan (python)", "invalid value", "f returned nan (float) [row: prompt '1+1']")]
    )
    guard.observe(1, {**_healthy(1), "reward/errors": 1.0})
    guard.observe(2, {**_healthy(2), "reward/errors": 1.0})
    with pytest.raises(RunStopped) as err:
        guard.observe(3, {**_healthy(3), "reward/errors": 0.0})
    text = str(err.value)
    assert "reward/errors averaged 0.67 over the last 3 steps" in text and "max_error_rate 0.5" in text
    assert "reward nan (python): f returned nan (float) [row: prompt '1+1']" in text


def test_a_rate_at_the_limit_or_a_transient_spike_does_not_stop() -> None:
    """Rates 1, 0, 0, 0, 0 over a window of 5: 0.2; then 0.5 exactly five times: 0.5 is not over 0.5."""
    guard = FailureGuard(FailureConfig(max_error_rate=0.5, error_window=5))
    for step, rate in enumerate([1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5], start=1):
        guard.observe(step, {**_healthy(step), "env/errors": rate})


def test_a_run_shorter_than_the_window_is_judged_at_its_end() -> None:
    guard = FailureGuard(FailureConfig(error_window=5))
    guard.observe(1, {**_healthy(1), "env/errors": 1.0})
    guard.observe(2, {**_healthy(2), "env/errors": 0.5})
    with pytest.raises(RunStopped, match=r"env/errors averaged 0.75 over the last 2 steps"):
        guard.finish(2)


def test_non_finite_loss_stops_naming_step_and_role_unless_skipped(caplog: pytest.LogCaptureFixture) -> None:
    metrics = {**_healthy(4), "actor/grad_norm": math.nan}
    with pytest.raises(
        RunStopped, match=r"step 4: a non-finite loss or gradient in role 'actor' \(actor/grad_norm = nan\)"
    ):
        FailureGuard().observe(4, metrics)
    with pytest.raises(RunStopped, match=r"critic/value_loss = inf"):
        FailureGuard().observe(1, {**_healthy(1), "critic/value_loss": math.inf})
    skip = FailureGuard(FailureConfig(non_finite="skip"))
    with caplog.at_level(logging.WARNING, logger="roll.failures"):
        skip.observe(4, metrics)
    assert "actor/grad_norm = nan" in caplog.text and "skipped" in caplog.text
    FailureGuard().observe(1, {"eval/loss": math.nan})  # held-out numbers are not training numbers


def test_steps_without_updates_stop_after_the_limit_and_say_why() -> None:
    """Three steps whose every advantage is 0 (updates 0, reward/std 0) with limit 3; a step with an update in
    between resets the count."""
    guard = FailureGuard(FailureConfig(max_steps_without_update=3))
    idle = {**_healthy(0), "actor/updates": 0.0, "reward/std": 0.0}
    guard.observe(1, idle)
    guard.observe(2, idle)
    guard.observe(3, _healthy(3))
    guard.observe(4, idle)
    guard.observe(5, idle)
    with pytest.raises(RunStopped) as err:
        guard.observe(6, idle)
    assert "no useful optimizer update in the last 3 steps" in str(err.value)
    assert "every row's advantage was 0" in str(err.value) and "reward/std 0" in str(err.value)
    nothing = FailureGuard(FailureConfig(max_steps_without_update=1))
    with pytest.raises(RunStopped, match="no sample to train on"):
        nothing.observe(1, {"samples": 0.0, "actor/updates": 0.0})
    FailureGuard(FailureConfig(max_steps_without_update=1)).observe(
        1, {"critic/value_loss": 0.3}
    )  # not judged


def test_the_first_report_of_each_kind_is_shown_once_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def user_code() -> None:
        raise ZeroDivisionError("division by zero in my reward")

    try:
        user_code()
    except ZeroDivisionError as exc:
        first = report_exception("reward arith", exc)
    again = ErrorReport("reward arith", "ZeroDivisionError", "ZeroDivisionError: again", None)
    other = ErrorReport("env sokoban", "timeout", "timeout: no answer within 2s", None)
    guard = FailureGuard()
    with caplog.at_level(logging.ERROR, logger="roll.failures"):
        assert guard.show([first, again, None, other, again]) == 2
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and caplog.text.count("Traceback (most recent call last)") == 1
    assert "in user_code" in caplog.text and "division by zero in my reward" in caplog.text
    assert guard.counts == {("reward arith", "ZeroDivisionError"): 3, ("env sokoban", "timeout"): 1}
