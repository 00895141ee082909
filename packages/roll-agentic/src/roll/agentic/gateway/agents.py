"""Run user agents against the gateway: one thread per episode, a deadline each, failures as env errors.

An agent is the user's own code: a callable ``agent(base_url, api_key, task) -> reward`` (:class:`AgentFn`), or
a ``roll.agent`` entry point whose spec builds one (:class:`~roll.core.types.AgentSpec`). It points any
OpenAI client at ``base_url`` with ``api_key``, does what it does (tool loops, frameworks), and returns the
episode's reward: a finite number (a bool counts as 0/1), or a mapping with a ``"reward"`` key.

:meth:`AgentGateway.rollout` runs ``group_size`` episodes per task row, each in its own thread with its own
``base_url``, all at once; the gateway batches their calls. An episode ends when its agent returns (``done``),
raises (``error``: its traceback is shown once per kind by the driver, the rate counts toward
``failures.max_error_rate``) or runs past ``gateway.episode_timeout_s`` (``timeout``: later calls are refused;
Python cannot stop the thread, so it is left to finish, as cut-off env calls are). Errors and timeouts drop the
episode: its calls never reach training.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.episode import Sample
from roll.agentic.gateway.config import GatewayConfig, GatewaySamplingConfig
from roll.agentic.gateway.record import EpisodeLog, episode_samples
from roll.agentic.gateway.sampler import Batcher, Sampler
from roll.agentic.gateway.server import GatewayServer
from roll.core import plugins
from roll.core.errors import PluginError
from roll.core.failures import ErrorReport, report_exception

__all__ = ["AgentFn", "AgentGateway", "AgentRollout", "load_agent"]


class AgentFn(Protocol):
    def __call__(self, base_url: str, api_key: str, task: Mapping[str, Any]) -> Any:
        """Play one episode of ``task`` through the OpenAI API at ``base_url``; return its reward."""
        ...


def load_agent(name: str, options: Mapping[str, Any] | None = None) -> AgentFn:
    """The agent of ``roll.agent`` entry point ``name``, built from ``options`` (its spec's config model)."""
    spec = plugins.load("roll.agent", name)
    config = spec.config_model.model_validate(dict(options or {})) if spec.config_model else None
    agent = spec.build(config)
    if not callable(agent):
        raise PluginError(f"roll.agent plugin {name!r} built a {type(agent).__name__}, which is not callable")
    return agent  # type: ignore[no-any-return]


@dataclass
class AgentRollout:
    """The episodes of one rollout (``started``), the kept ones (``episodes``) and what failed."""

    started: list[EpisodeLog]
    tag: str = "agent"
    wall_s: float = 0.0
    episodes: list[EpisodeLog] = field(init=False)

    def __post_init__(self) -> None:
        self.episodes = [e for e in self.started if e.kept]

    def samples(self) -> list[Sample]:
        """Training rows of every kept episode (:func:`~.record.episode_samples`), from recorded ids only."""
        return [s for e in self.episodes for s in episode_samples(e, self.tag)]

    @property
    def errors(self) -> list[ErrorReport]:
        return [e.report for e in self.started if e.report is not None]

    def metrics(self) -> dict[str, float]:
        n, kept = max(len(self.started), 1), self.episodes
        k = max(len(kept), 1)
        return {
            "agent/reward": sum(e.reward for e in kept) / k,
            "agent/success_rate": sum(e.reward > 0 for e in kept) / k,
            "agent/calls": sum(len(e.calls) for e in kept) / k,
            "agent/tokens_sampled": sum(e.tokens_sampled for e in kept) / k,
            "agent/errors": sum(e.status in ("error", "timeout") for e in self.started) / n,
            "agent/timeouts": float(sum(e.status == "timeout" for e in self.started)),
            "agent/refused_calls": float(sum(e.refused for e in self.started)),
            "agent/episodes_kept": float(len(kept)),
        }


class AgentGateway:
    """The gateway of one rollout worker: an HTTP server on 127.0.0.1 over ``sampler``, and the agent runner.
    ``close`` stops the server (use it as a context manager)."""

    def __init__(
        self,
        config: GatewayConfig,
        encoder: ChatEncoder,
        sampler: Sampler,
        agent: AgentFn,
        name: str = "agent",
        *,
        sampling: GatewaySamplingConfig | None = None,
    ) -> None:
        """``sampling``: how every call samples (the run's ``rollout``); default :class:`GatewaySamplingConfig`'s."""
        self.config, self.agent, self.name = config, agent, name
        self.batcher = Batcher(sampler, config.batch_wait_s, config.generate_timeout_s)
        self.server = GatewayServer(config, encoder, self.batcher, sampling or GatewaySamplingConfig())

    def __enter__(self) -> AgentGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.server.close()
        self.batcher.close()

    def rollout(self, tasks: Sequence[Mapping[str, Any]], group_size: int, *, seed: int) -> AgentRollout:
        """``group_size`` episodes of each task row (group ``g`` = row ``g``); see the module docstring."""
        start = time.monotonic()
        deadline = start + self.config.episode_timeout_s
        episodes = [
            EpisodeLog(g * group_size + j, g, dict(task), deadline)
            for g, task in enumerate(tasks)
            for j in range(group_size)
        ]
        self.server.open_rollout(episodes, secrets.token_urlsafe(24), seed)
        threads = [self._start(e) for e in episodes]
        for thread in threads:
            thread.join(timeout=max(deadline - time.monotonic(), 0.0))
        for e in episodes:
            with e.lock:
                if e.status == "running":  # its agent is still running: cut off, later calls refused
                    e.status = "timeout"
                    e.report = ErrorReport(
                        f"agent {self.name}", "timeout",
                        f"episode {e.index} (task row {e.group}) ran past gateway.episode_timeout_s = "
                        f"{self.config.episode_timeout_s} s after {len(e.calls)} call(s)",
                    )  # fmt: skip
        self.server.open_rollout([], "", seed)  # nothing of this rollout is served any more
        return AgentRollout(episodes, self.name, time.monotonic() - start)

    def _start(self, episode: EpisodeLog) -> threading.Thread:
        url, key = self.server.base_url(episode.index), self.server.api_key
        thread = threading.Thread(
            target=self._play, args=(episode, url, key), name=f"agent-{episode.index}", daemon=True
        )
        thread.start()
        return thread

    def _play(self, episode: EpisodeLog, url: str, key: str) -> None:
        try:
            reward = _reward(self.agent(url, key, dict(episode.task)))
        except Exception as exc:  # user code: shown once per kind by the driver, counted, episode dropped
            where = f"episode {episode.index} (task row {episode.group}) after {len(episode.calls)} call(s)"
            report = report_exception(f"agent {self.name}", exc, f"{type(exc).__name__}: {exc} [{where}]")
            _finish(episode, "error", 0.0, report)
            return
        _finish(episode, "done", reward, None)


def _finish(episode: EpisodeLog, status: str, reward: float, report: ErrorReport | None) -> None:
    with episode.lock:
        if episode.status == "running":  # a timed-out episode stays timed out
            episode.status, episode.reward, episode.report = status, reward, report  # type: ignore[assignment]


def _reward(value: Any) -> float:
    """The agent's return value as a finite float (see the module docstring); anything else raises."""
    raw = value.get("reward") if isinstance(value, Mapping) else value
    if isinstance(raw, (bool, int, float)):
        reward = float(raw)
        if math.isfinite(reward):
            return reward
    raise ValueError(
        f"an agent must return a finite number (or {{'reward': number}}); it returned {value!r:.200}"
    )
