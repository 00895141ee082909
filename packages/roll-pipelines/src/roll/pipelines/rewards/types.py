"""The common interface of roll's verifiable reward functions.

Map of the abstractions:

- :class:`RewardRequest`: one response to score, with its prompt, ground truth, a routing ``tag`` and free-form
  ``metadata`` (for example ifeval's instruction list or a code problem's test cases).
- :class:`RewardResult`: a float ``score`` plus ``info``, a flat dict of sub-scores and diagnostics (``correct``,
  ``format``, ``error`` ...). A reward never raises for a bad *response*; it returns score 0 and says why in
  ``info["error"]``. It raises (a :class:`roll.core.errors.RollError`) only for a broken *setup*.
- :class:`RewardFunction`: ``score(requests) -> results``, batched, one result per request in order. An
  implementation may run the batch concurrently inside (processes, threads, asyncio).

Reward workers (Ray actors, elsewhere) call these cores; nothing here imports Ray or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

UNSCORED = "unscored"
"""The ``info`` key that marks a row the reward could not score; its value is the kind of failure."""


@dataclass(frozen=True)
class RewardRequest:
    """One response to score. ``metadata`` carries whatever a particular reward needs beyond the text."""

    response: str
    prompt: str = ""
    ground_truth: str = ""
    tag: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardResult:
    """A score and a flat dict of sub-scores and diagnostics (values are plain, picklable Python)."""

    score: float
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failed(cls, error: str, **info: Any) -> RewardResult:
        """Score 0 with the reason in ``info["error"]``: the shape every reward uses for an unscorable item."""
        return cls(score=0.0, info={**info, "error": error})

    @classmethod
    def unscored(
        cls, error: str, *, kind: str = "error", traceback: str | None = None, **info: Any
    ) -> RewardResult:
        """The reward could not score this row (see the module docstring): score 0, the reason in
        ``info["error"]``, ``kind`` (an exception type, ``invalid value``, ``timeout``) in ``info["unscored"]``
        and the traceback text, when there is one, in ``info["traceback"]``."""
        extra = {"traceback": traceback} if traceback else {}
        return cls(score=0.0, info={**info, **extra, "error": error, UNSCORED: kind})

    @property
    def is_unscored(self) -> bool:
        """True when the reward failed to score the row (a reward error, not a verdict)."""
        return UNSCORED in self.info


@runtime_checkable
class RewardFunction(Protocol):
    """A batched scorer: ``len(score(requests)) == len(requests)``, results in request order."""

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]: ...
