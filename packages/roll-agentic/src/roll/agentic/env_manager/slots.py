"""Run many envs in one process, each call with a deadline, so one hung env cannot stall a batch.

An :class:`EnvSlots` owns a fixed number of *slots*; a slot holds at most one live env. ``reset`` builds a fresh
env in a slot (from the env mix's entry points) and resets it with a seed; ``step`` steps it. Every call of a
batch runs in its own daemon thread and all share one deadline (``timeout_s`` from the start of the batch): a
call still running at the deadline is *cut off*: the slot is marked dead, its thread is abandoned (Python cannot
kill a thread, and a daemon thread never blocks interpreter exit) and the env object is never touched again. A
call that raises is reported the same way with the error text (and, for the first error of each exception type,
its traceback, which the driver shows once: :mod:`roll.core.failures`). The next ``reset`` of that slot builds a new env.

Threads, not processes: envs are plain Python objects that are not picklable mid-episode, and a step is usually
microseconds; the GIL is released by a sleeping or I/O-bound env, which is exactly the kind that hangs. A cut-off
thread that keeps running (a spinning env burns a core for good) is counted by :meth:`EnvSlots.leaked`; the env
workers' pool restarts such a worker before the next rollout (:class:`~roll.agentic.env_manager.worker.ClusterEnvPool`),
and also one that does not answer at all (an env holding the GIL in C code freezes the whole process).

The valid actions an env accepts are read from its ``action_space_text`` when it has the form
``"Valid actions: A, B, C"`` (the built-in grid envs); otherwise the env reads the model's raw output itself
(countdown, tool envs) and ``valid_actions`` is None.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from roll.agentic.env_manager.config import EnvEntryConfig
from roll.agentic.tools.registry import build_tools
from roll.agentic.tools.wrapper import ToolEnvWrapper
from roll.agentic.types import Env, Observation, StepResult
from roll.core import plugins
from roll.core.errors import ConfigError, ConfigIssue, PluginError

__all__ = [
    "EnvFactory",
    "EnvSlots",
    "ResetOutcome",
    "ResetRequest",
    "StepOutcome",
    "StepRequest",
    "build_env",
    "valid_actions_of",
]

EnvFactory = Callable[[int], Env]
"""``factory(entry_index) -> Env``: a fresh env of entry ``entry_index`` of the mix."""

_VALID_PREFIX = "valid actions:"


@dataclass(frozen=True)
class ResetRequest:
    entry: int
    seed: int


@dataclass(frozen=True)
class StepRequest:
    action: str


@dataclass(frozen=True)
class ResetOutcome:
    """``error`` is None on success; otherwise the env is dead and the other fields are empty."""

    observation: Observation = ""
    system_prompt: str = ""
    valid_actions: tuple[str, ...] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    traceback: str | None = None
    """The exception's traceback, sent with the first error of each exception type of a worker (the driver shows
    one per kind; the rest are counted)."""


@dataclass(frozen=True)
class StepOutcome:
    result: StepResult | None = None
    error: str | None = None
    traceback: str | None = None


def valid_actions_of(env: Env) -> tuple[str, ...] | None:
    """The action words of ``"Valid actions: A, B"``, or None when the env parses raw output itself."""
    text = env.action_space_text.strip()
    if not text.lower().startswith(_VALID_PREFIX) or ";" in text:
        return None
    words = tuple(w.strip() for w in text[len(_VALID_PREFIX) :].split(",") if w.strip())
    return words or None


def build_env(entry: EnvEntryConfig) -> Env:
    """The env of ``entry``: its ``roll.env`` spec, built with ``entry.options`` validated by the spec's model,
    wrapped in a :class:`~roll.agentic.tools.wrapper.ToolEnvWrapper` with ``entry.tools`` when there are any."""
    spec = plugins.load("roll.env", entry.type)
    env = spec.build(_env_config(spec, entry))
    if not isinstance(env, Env):
        raise PluginError(
            f"roll.env plugin {entry.type!r} built a {type(env).__name__}, which is not an Env "
            "(needs max_steps, system_prompt, action_space_text, reset, step, render and close)"
        )
    if not entry.tools:
        return env
    tools = [tool for t in entry.tools for tool in build_tools(t.type, t.options)]
    return ToolEnvWrapper(env, tools, entry.tool_calls)


def _env_config(spec: Any, entry: EnvEntryConfig) -> BaseModel | None:
    model = spec.config_model
    if model is None:
        if entry.options:
            raise ConfigError(f"env {entry.type!r} takes no options; remove {sorted(entry.options)}")
        return None
    data = dict(entry.options)
    if "type" in model.model_fields and "type" not in data:
        data["type"] = entry.type
    try:
        return model.model_validate(data)  # type: ignore[no-any-return]
    except ValidationError as exc:
        issues = [
            ConfigIssue(f"env {entry.type}: options.{'.'.join(map(str, e['loc']))}", e["msg"])
            for e in exc.errors()
        ]
        raise ConfigError(issues=issues) from None


def factory_for(entries: Sequence[EnvEntryConfig]) -> EnvFactory:
    """A factory that builds entry ``i`` of ``entries`` through the entry points."""
    frozen = list(entries)
    return lambda index: build_env(frozen[index])


def _step_fn(env: Env, action: str) -> Callable[[], StepResult]:
    return lambda: env.step(action)


class _Call:
    """One call in a daemon thread; ``done`` is set when it returned or raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: str | None = None
        self.kind: str | None = None
        self.traceback: str | None = None
        self.done = threading.Event()
        self._fn = fn
        threading.Thread(target=self._run, daemon=True, name="roll-env-call").start()

    def _run(self) -> None:
        try:
            self.value = self._fn()
        except Exception as exc:  # reported as this slot's failure (with its traceback); the batch goes on
            self.error, self.kind = f"{type(exc).__name__}: {exc}", type(exc).__name__
            self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        finally:
            self.done.set()


class EnvSlots:
    """``num_slots`` env slots driven in batches with a shared deadline. See the module docstring."""

    def __init__(self, num_slots: int, factory: EnvFactory, timeout_s: float) -> None:
        self.num_slots = num_slots
        self.timeout_s = timeout_s
        self._factory = factory
        self._envs: dict[int, Env] = {}
        self._traced: set[str] = set()  # exception types whose traceback has been sent once
        self._abandoned: list[_Call] = []

    def leaked(self) -> int:
        """Cut-off calls whose threads are still running (they cannot be stopped; only a process restart ends
        them)."""
        self._abandoned = [call for call in self._abandoned if not call.done.is_set()]
        return len(self._abandoned)

    def reset(self, requests: Sequence[ResetRequest | None]) -> list[ResetOutcome | None]:
        """Build a fresh env in every slot with a request and reset it with the request's seed."""
        self._check(requests)
        for slot, request in enumerate(requests):
            if request is not None:
                self._discard(slot)
        calls = {s: _Call(self._reset_fn(r)) for s, r in enumerate(requests) if r is not None}
        results = self._collect(calls)
        out: list[ResetOutcome | None] = [None] * len(requests)
        for slot, (value, error, trace) in results.items():
            if error is not None:
                out[slot] = ResetOutcome(error=error, traceback=trace)
                continue
            env, (obs, info) = value
            self._envs[slot] = env
            out[slot] = ResetOutcome(obs, env.system_prompt, valid_actions_of(env), dict(info))
        return out

    def step(self, requests: Sequence[StepRequest | None]) -> list[StepOutcome | None]:
        """Step the env of every slot with a request; a slot without a live env answers with an error."""
        self._check(requests)
        calls: dict[int, _Call] = {}
        out: list[StepOutcome | None] = [None] * len(requests)
        for slot, request in enumerate(requests):
            if request is None:
                continue
            env = self._envs.get(slot)
            if env is None:
                out[slot] = StepOutcome(error=f"slot {slot} has no live env (reset it first)")
                continue
            calls[slot] = _Call(_step_fn(env, request.action))
        for slot, (value, error, trace) in self._collect(calls).items():
            out[slot] = (
                StepOutcome(result=value) if error is None else StepOutcome(error=error, traceback=trace)
            )
        return out

    def close(self) -> None:
        for slot in list(self._envs):
            self._discard(slot)

    def _reset_fn(
        self, request: ResetRequest
    ) -> Callable[[], tuple[Env, tuple[Observation, Mapping[str, Any]]]]:
        def run() -> tuple[Env, tuple[Observation, Mapping[str, Any]]]:
            env = self._factory(request.entry)
            return env, env.reset(seed=request.seed)

        return run

    def _collect(self, calls: Mapping[int, _Call]) -> dict[int, tuple[Any, str | None, str | None]]:
        """Wait for every call until the shared deadline; late calls kill their slot. ``(value, error,
        traceback)`` per slot, the traceback only with the first error of its exception type."""
        deadline = time.monotonic() + self.timeout_s
        results: dict[int, tuple[Any, str | None, str | None]] = {}
        for slot, call in calls.items():
            if not call.done.wait(max(0.0, deadline - time.monotonic())):
                self._envs.pop(slot, None)  # abandoned with its thread; never touched again
                self._abandoned.append(call)
                results[slot] = (None, f"timeout: no answer within {self.timeout_s:g}s (env cut off)", None)
                continue
            trace = None
            if call.error is not None:
                self._discard(slot)
                if call.kind not in self._traced:
                    self._traced.add(str(call.kind))
                    trace = call.traceback
            results[slot] = (call.value, call.error, trace)
        return results

    def _discard(self, slot: int) -> None:
        env = self._envs.pop(slot, None)
        if env is not None:
            with contextlib.suppress(Exception):  # a broken env must not take the batch down with it
                env.close()

    def _check(self, requests: Sequence[object]) -> None:
        if len(requests) != self.num_slots:
            raise ValueError(
                f"expected one request (or None) per slot: {self.num_slots}, got {len(requests)}"
            )
