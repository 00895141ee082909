"""Rewards as plain Python functions: ``type: python`` with ``function: my_pkg.rewards:exact`` or ``file.py:name``.

The contract of a reward function (checked when the config is validated, so ``roll validate`` reports a wrong
signature before any actor starts)::

    def my_reward(response: str, ground_truth: str, **kwargs) -> float | bool | dict

- ``response`` and ``ground_truth`` are passed positionally: the first two parameters must accept them.
- Keyword arguments offered: ``prompt`` (str), ``tag`` (str), ``metadata`` (a mapping) and every key of the
  config's ``kwargs``. A function without ``**kwargs`` receives only the names it declares; any other parameter
  it has must have a default.
- It returns a number or a bool (the score), or a mapping with a ``"score"`` key whose other entries become the
  result's ``info`` (put ``"correct": bool`` there to drive the accuracy metric).

With ``batched: true`` the same names carry lists, one entry per row (``responses``, ``ground_truths``,
``prompt=[...]`` ...), and the function returns a list of such values, as TRL's reward callables do. An exception
in the function, or a value that is not a finite number (NaN, inf, ``None``, a string), leaves that row (or
batch) unscored (:meth:`RewardResult.unscored`: score 0, the reason naming the function and the value, the
traceback): one bad row must not stop a training step, ``reward/errors`` counts it as a rate, the first of each
kind is shown with its traceback, and a run whose rate stays high stops (:mod:`roll.core.failures`).

Deadline: each call (a row, or a batch with ``batched``) must return within ``timeout_s``. The function runs in
a child process (:mod:`roll.pipelines.rewards._isolated`: a thread cannot be stopped, a process can be killed), so
a function that never returns, even one that ignores signals, is killed at its deadline and its row fails with the
reason; the next row gets a fresh process. ``timeout_s: null`` calls the function in the worker's own process,
with no per-row deadline (only the reward role's ``call_timeout_s`` on the whole share of rows).

Importing this module is light (stdlib and pydantic); resolving the function imports the user's module.
"""

from __future__ import annotations

import inspect
import math
import numbers
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from roll.core.callables import is_file_target, resolve_callable
from roll.core.config.base import RollModel
from roll.core.config.validate import issues_error
from roll.core.errors import ConfigIssue
from roll.pipelines.rewards._isolated import IsolatedFunction, RemoteTraceback, RewardTimeoutError
from roll.pipelines.rewards.types import RewardRequest, RewardResult

OFFERED_KWARGS = ("prompt", "tag", "metadata")
"""Keyword arguments every call offers beyond ``response`` and ``ground_truth``."""


class PythonRewardConfig(RollModel):
    """A reward computed by a user's Python function (see the module docstring for the contract).

    ``function`` is ``package.module:name`` (importable where the reward workers run) or ``path/to/file.py:name``
    (a relative path is taken from the directory ``roll`` runs in and stored absolute).
    """

    function: str = Field(min_length=3, description="module:name or path/to/file.py:name")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="extra keyword arguments of every call")
    batched: bool = Field(False, description="call once per batch with lists instead of once per row")
    timeout_s: float | None = Field(
        30.0,
        gt=0,
        description="deadline of each call (each row; each batch when batched), enforced by running the function "
        "in a child process that is killed when late (the row fails); null: call it in the worker's process, "
        "with no per-row deadline",
    )

    @field_validator("function")
    @classmethod
    def _absolute_file(cls, value: str) -> str:
        target, _, name = value.rpartition(":")
        if is_file_target(target):
            return f"{Path(target).expanduser().resolve()}:{name}"
        return value

    @model_validator(mode="after")
    def _check_function(self) -> PythonRewardConfig:
        try:
            fn = resolve_callable(self.function)
        except ValueError as exc:
            raise issues_error([ConfigIssue("function", str(exc))]) from None
        try:
            check_signature(fn, self.function, set(self.kwargs))
        except ValueError as exc:
            hint = "the function must look like: def reward(response, ground_truth, **kwargs) -> float"
            raise issues_error([ConfigIssue("function", str(exc), hint)]) from None
        return self


def check_signature(fn: Callable[..., Any], where: str, extra_kwargs: set[str]) -> None:
    """Raise ValueError unless ``fn(response, ground_truth, **offered)`` is a valid call (module docstring)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: cannot read its signature: {exc}") from exc
    shown = f"{where}{inspect.signature(fn)}"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_positional = any(p.kind is p.VAR_POSITIONAL for p in params)
    if len(positional) < 2 and not var_positional:
        raise ValueError(
            f"{shown} must take (response, ground_truth, **kwargs): it accepts fewer than two positional "
            "arguments"
        )
    offered = {*OFFERED_KWARGS, *extra_kwargs}
    named = {p.name for p in positional[2:]} | {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    required = [
        p.name
        for p in [*positional[2:], *(p for p in params if p.kind is p.KEYWORD_ONLY)]
        if p.default is p.empty and p.name not in offered
    ]
    if required:
        raise ValueError(
            f"{shown}: parameters {required} have no default and roll does not pass them; it passes "
            f"{sorted(offered)} (add them to `kwargs:` or give them defaults)"
        )
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    unknown = sorted(extra_kwargs - named) if not var_keyword else []
    if unknown:
        raise ValueError(f"{shown} does not accept the configured kwargs {unknown}")


def accepted_kwargs(fn: Callable[..., Any]) -> set[str] | None:
    """The keyword names ``fn`` declares beyond the first two, or None when it takes ``**kwargs``."""
    params = list(inspect.signature(fn).parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def to_result(value: Any, where: str = "reward function") -> RewardResult:
    """A function's return value as a :class:`RewardResult` (module docstring). Anything else (a NaN or infinite
    score, ``None``, a string, a mapping without a numeric ``score``) is an unscored row whose reason names
    ``where`` and the value: a NaN reward would otherwise poison every advantage of its group and every update."""
    if isinstance(value, RewardResult):
        return value if _finite(value.score) else _invalid(where, value.score)
    if isinstance(value, bool):
        return RewardResult(float(value), {"correct": value})
    if isinstance(value, numbers.Real):
        return RewardResult(float(value)) if _finite(float(value)) else _invalid(where, value)
    if isinstance(value, Mapping) and isinstance(value.get("score"), numbers.Real):
        if not _finite(value["score"]):
            return _invalid(where, value["score"], "'score' ")
        info = {str(k): v for k, v in value.items() if k != "score"}
        return RewardResult(float(value["score"]), info)
    return _invalid(where, value)


FLOAT32_MAX = 3.4028234663852886e38
"""Scores travel as float32 tensors: a larger float64 would arrive as inf."""


def _finite(value: float) -> bool:
    return math.isfinite(value) and abs(value) <= FLOAT32_MAX


def _invalid(where: str, value: Any, what: str = "") -> RewardResult:
    shown = f"{value!r}"
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return RewardResult.unscored(
        f"{where} returned {what}{shown} ({type(value).__name__}); a reward must be a finite number, a bool or a "
        "mapping with a finite numeric 'score'",
        kind="invalid value",
    )


def _raised(where: str, exc: Exception) -> RewardResult:
    if isinstance(exc.__cause__, RemoteTraceback):  # raised in the child: its traceback is the user's code
        text = exc.__cause__.text
    else:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return RewardResult.unscored(
        f"{where} raised {type(exc).__name__}: {exc}", kind=type(exc).__name__, traceback=text
    )


class PythonReward:
    """Calls the configured function per row (or once per batch with ``batched``)."""

    def __init__(self, config: PythonRewardConfig) -> None:
        self.config = config
        self.fn = resolve_callable(config.function)
        self._accepted = accepted_kwargs(self.fn)
        # every call goes through _call: in a child process under the deadline, or here without one
        self._call: Callable[..., Any] = (
            self.fn if config.timeout_s is None else IsolatedFunction(config.function, config.timeout_s)
        )

    def _kwargs(self, offered: dict[str, Any]) -> dict[str, Any]:
        offered = {**offered, **self.config.kwargs}
        if self._accepted is None:
            return offered
        return {k: v for k, v in offered.items() if k in self._accepted}

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        if self.config.batched:
            return self._score_batch(requests)
        return [self._score_one(r) for r in requests]

    def _score_one(self, r: RewardRequest) -> RewardResult:
        kwargs = self._kwargs({"prompt": r.prompt, "tag": r.tag, "metadata": r.metadata})
        try:
            value = self._call(r.response, r.ground_truth, **kwargs)
        except (
            RewardTimeoutError
        ) as exc:  # killed at its deadline: the reason says it all, no traceback to show
            return RewardResult.unscored(str(exc), kind="timeout")
        except Exception as exc:  # user code: this row is unscored, the traceback travels with it
            return _raised(self.config.function, exc)
        return to_result(value, self.config.function)

    def _score_batch(self, requests: list[RewardRequest]) -> list[RewardResult]:
        offered = {
            "prompt": [r.prompt for r in requests],
            "tag": [r.tag for r in requests],
            "metadata": [r.metadata for r in requests],
        }
        responses, truths = [r.response for r in requests], [r.ground_truth for r in requests]
        try:
            values = list(self._call(responses, truths, **self._kwargs(offered)))
        except RewardTimeoutError as exc:  # the whole batched call was killed at its deadline
            return [RewardResult.unscored(str(exc), kind="timeout")] * len(requests)
        except Exception as exc:  # user code: every row of the batch is unscored
            return [_raised(self.config.function, exc)] * len(requests)
        if len(values) != len(requests):
            error = f"{self.config.function} returned {len(values)} scores for {len(requests)} rows"
            return [RewardResult.unscored(error, kind="invalid value")] * len(requests)
        return [to_result(v, self.config.function) for v in values]
