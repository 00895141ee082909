"""One exception hierarchy for roll.

Every error roll raises on purpose derives from :class:`RollError` and also from its closest stdlib cousin, so
callers can catch either (``except ValueError`` still catches a :class:`ConfigError`). All of them pickle, because
Ray carries exceptions from actors back to the driver: each class stores its constructor keyword arguments and
rebuilds itself from them in ``__reduce__``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class RollError(Exception):
    """Base of every error roll raises deliberately.

    Subclasses pass a finished, human-readable message to ``super().__init__`` and keep their structured fields
    as attributes; ``_kwargs`` remembers how to rebuild them after a trip through pickle.
    """

    def __init__(self, message: str = "", **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self._kwargs = fields
        for key, value in fields.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self._kwargs))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[RollError], message: str, fields: dict[str, Any]) -> RollError:
    err = cls.__new__(cls)
    RollError.__init__(err, message, **fields)
    return err


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config: where (dotted key path, and file:line when known), what, and how to fix it."""

    path: str
    message: str
    hint: str | None = None
    source: str | None = None

    def render(self) -> str:
        where = self.path or self.source or "<root>"
        if self.source and self.path:
            where = f"{where} ({self.source})"
        text = f"{where}: {self.message}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text


class ConfigError(RollError, ValueError):
    """A config that cannot be loaded. Carries every issue found, not just the first."""

    def __init__(self, message: str = "", *, issues: list[ConfigIssue] | None = None) -> None:
        issues = list(issues or [])
        if not message:
            count = len(issues)
            lines = [f"{count} problem{'s' if count != 1 else ''} in config:"]
            lines += ["  - " + issue.render().replace("\n", "\n    ") for issue in issues]
            message = "\n".join(lines)
        super().__init__(message, issues=issues)
        self.issues: list[ConfigIssue] = issues


class PluginError(RollError, LookupError):
    """A plugin that is unknown, defined twice, fails to import, or does not satisfy its protocol."""


class ResourceError(RollError, RuntimeError):
    """Roles that ask for more CPUs or GPUs than the Ray cluster has, or Ray that cannot start."""


class WorkerError(RollError, RuntimeError):
    """A remote call that failed. Names the role, the rank and the method."""


class WorkerTimeoutError(WorkerError, TimeoutError):
    """A remote call that did not answer within its timeout (a hung or dead actor)."""


class CheckpointError(RollError, RuntimeError):
    """A checkpoint that cannot be written, found or restored."""


class DataError(RollError, ValueError):
    """Data that cannot be read or does not have the fields a pipeline needs."""


class RunDirError(RollError, FileExistsError):
    """An output dir that already holds a run, which a new run would append to or overwrite. The message names
    the ways on: ``resume=auto`` (continue it) or ``overwrite=true`` (move it aside and start afresh)."""
