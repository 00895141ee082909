"""What the gateway records, token in and token out, and how an episode's calls become training rows.

Every model call of an episode is a :class:`CallRecord`: the exact prompt ids the policy saw (the chat template's
render of the request, tokenized once, by the gateway), and per choice the sampled ids (stop token included), their
log-probs and the policy version of the weights that sampled them. Training rows are built from these ids alone
(:func:`episode_samples`): nothing is decoded and re-tokenized, so the trained tokens are the sampled ones and the
sampler's log-probs line up with them.

One row per choice of every call (the step-wise layout of :func:`roll.agentic.env_manager.episode.step_samples`):
``prompt_ids + response_ids`` with the loss on the response only, the episode's reward as its score and its
episode as its group (so GRPO's groups are the ``group_size`` episodes of one task row).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from roll.agentic.env_manager.episode import Sample
from roll.agentic.env_manager.manager import Generation
from roll.core.failures import ErrorReport

__all__ = ["CallRecord", "EpisodeLog", "EpisodeStatus", "episode_samples"]

EpisodeStatus = Literal["running", "done", "error", "timeout"]


@dataclass(frozen=True)
class CallRecord:
    """One model call: its prompt ids and one :class:`Generation` per choice (``n`` of them)."""

    endpoint: str
    prompt_ids: list[int]
    choices: list[Generation]


@dataclass
class EpisodeLog:
    """One agent episode: its task row, deadline, calls and outcome. Thread-safe where the server writes it."""

    index: int
    group: int
    task: dict[str, Any]
    deadline: float
    """``time.monotonic()`` after which calls are refused."""
    calls: list[CallRecord] = field(default_factory=list)
    status: EpisodeStatus = "running"
    reward: float = 0.0
    report: ErrorReport | None = None
    refused: int = 0
    """Calls refused (after the deadline, over the call limit, too long)."""
    issued: int = 0
    """Calls admitted so far (each one's sampling seed is derived from its number)."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, call: CallRecord) -> None:
        with self.lock:
            self.calls.append(call)

    @property
    def kept(self) -> bool:
        """Episodes that an agent error or timeout ended are dropped, as env errors are."""
        return self.status == "done" and bool(self.calls)

    @property
    def tokens_sampled(self) -> int:
        return sum(len(g.ids) for c in self.calls for g in c.choices)


def episode_samples(episode: EpisodeLog, tag: str = "agent") -> list[Sample]:
    """The training rows of a finished episode (see the module docstring); none for a dropped one."""
    if not episode.kept:
        return []
    rows = []
    for step, call in enumerate(episode.calls):
        for gen in call.choices:
            prompt = call.prompt_ids
            rows.append(
                Sample(
                    input_ids=prompt + gen.ids,
                    loss_mask=[0] * len(prompt) + [1] * len(gen.ids),
                    logp=[0.0] * len(prompt) + list(gen.logp),
                    score=episode.reward,
                    group=episode.group,
                    episode=episode.index,
                    tag=tag,
                    success=episode.reward > 0,
                    step=step,
                    step_return=episode.reward,
                    episode_return=episode.reward,
                    policy_version=gen.policy_version,
                )
            )
    return rows
