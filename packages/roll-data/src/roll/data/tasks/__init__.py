"""Built-in offline tasks with verifiable answers, by name.

``get_task("arithmetic")`` returns a :class:`Task`; :func:`builtin_dataset` turns ``"builtin:arithmetic"`` (what a
config's ``dataset:`` may say) into a ``datasets.Dataset`` of one of three kinds, ``sft``, ``preference`` or
``rl`` (column layouts in :mod:`roll.data.tasks.base`). Tasks are plain factories taking keyword options, so a
config can pass ``{"level": 4}`` or ``{"digits": 3}`` through.

Importing this module is light: ``datasets`` is imported only when a dataset is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from roll.core.errors import DataError
from roll.data.tasks.arithmetic import ArithmeticTask
from roll.data.tasks.base import (
    Problem,
    Split,
    Task,
    preference_dataset,
    problems,
    rl_dataset,
    sft_dataset,
    split_of,
)
from roll.data.tasks.compare import CompareTask
from roll.data.tasks.visual import ShapesTask

if TYPE_CHECKING:
    from datasets import Dataset

BUILTIN_PREFIX = "builtin:"
DatasetKind = Literal["sft", "preference", "rl"]

_BUILDERS: dict[str, Callable[..., Dataset]] = {
    "sft": sft_dataset,
    "preference": preference_dataset,
    "rl": rl_dataset,
}


def _levelled(cls: Any, name: str) -> Callable[..., Task]:
    """A factory taking either ``level`` (a named difficulty, ``cls.level``) or explicit options, not both."""

    def factory(level: int | None = None, **options: Any) -> Task:
        if level is not None:
            if options:
                raise DataError(
                    f"{name}: pass either level or explicit options, not both (got {sorted(options)})"
                )
            task: Task = cls.level(level)
            return task
        built: Task = cls(**options)
        return built

    return factory


_TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": _levelled(ArithmeticTask, "arithmetic"),
    "compare": CompareTask,
    "shapes": _levelled(ShapesTask, "shapes"),
}


def register_task(name: str, factory: Callable[..., Task]) -> None:
    """Add a task factory under ``name``; a name already taken raises instead of silently replacing it."""
    if name in _TASKS:
        raise DataError(f"task {name!r} is already registered ({_TASKS[name]!r})")
    _TASKS[name] = factory


def task_names() -> list[str]:
    """Names of every registered task, sorted."""
    return sorted(_TASKS)


def get_task(name: str, **options: Any) -> Task:
    """The task registered as ``name`` (a leading ``builtin:`` is accepted), built with ``options``."""
    key = name.removeprefix(BUILTIN_PREFIX)
    if key not in _TASKS:
        raise DataError(f"unknown built-in task {name!r}; known tasks: {', '.join(task_names())}")
    try:
        return _TASKS[key](**options)
    except TypeError as exc:
        raise DataError(f"bad options {options!r} for built-in task {key!r}: {exc}") from exc


def is_builtin(spec: str) -> bool:
    """Whether a ``dataset:`` value names a built-in task (``"builtin:<task>"``)."""
    return spec.startswith(BUILTIN_PREFIX)


def builtin_dataset(
    spec: str,
    kind: DatasetKind,
    n: int,
    *,
    seed: int = 0,
    split: Split = "train",
    options: dict[str, Any] | None = None,
) -> Dataset:
    """``n`` rows of ``kind`` from the built-in task ``spec`` (``"arithmetic"`` or ``"builtin:arithmetic"``)."""
    if kind not in _BUILDERS:
        raise DataError(f"unknown dataset kind {kind!r}; use one of {sorted(_BUILDERS)}")
    return _BUILDERS[kind](get_task(spec, **(options or {})), n, seed=seed, split=split)


__all__ = [
    "BUILTIN_PREFIX",
    "ArithmeticTask",
    "CompareTask",
    "DatasetKind",
    "Problem",
    "ShapesTask",
    "Split",
    "Task",
    "builtin_dataset",
    "get_task",
    "is_builtin",
    "preference_dataset",
    "problems",
    "register_task",
    "rl_dataset",
    "sft_dataset",
    "split_of",
    "task_names",
]
