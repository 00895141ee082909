"""The env manager: drive many envs turn by turn with one batched ``generate`` call per turn.

One rollout::

    reset every env (groups of G envs share a seed)          pool.reset   (env workers, deadline per call)
    repeat until every kept group has finished:
        prompts of all live envs                             trajectory: the conversation so far, as tokens
                                                             step: system + last K turns + observation
        one batched generate                                 actor_infer (or any GenerateFn)
        parse each answer (format penalty if broken)         roll.agentic.parsing.parse_action
        step every live env                                  pool.step    (a hung env is cut off)
    keep the first ``num_groups`` groups to finish (``extra_groups`` were started as redundancy)

An episode ends when its env says so (terminated or truncated), at ``max_turns``, when its next prompt plus a turn
would not fit ``max_context_tokens`` (kept, truncated), or when its env times out or raises (dropped: its
trajectory never reaches training; the group trains with the members it has left).

The manager owns no model and no Ray: ``pool`` is an :class:`EnvPool` (in-process :class:`~.slots.EnvSlots`, or
the env workers' :class:`~.worker.ClusterEnvPool`) and ``generate`` a :class:`GenerateFn`.

Image observations: a turn whose prompts show images calls ``generate`` with ``vision=`` (the per-prompt
columns :data:`~roll.core.columns.PIXEL_VALUES` / :data:`~roll.core.columns.IMAGE_GRID_THW`, None for a prompt
without images); a turn of text prompts calls it exactly as before.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from roll.agentic.env_manager.chat import ChatEncoder, EncodedImages, vision_rows
from roll.agentic.env_manager.config import EnvManagerConfig
from roll.agentic.env_manager.episode import Episode, Sample, Turn, step_samples, trajectory_samples
from roll.agentic.env_manager.slots import ResetOutcome, ResetRequest, StepOutcome, StepRequest
from roll.agentic.parsing import parse_action
from roll.core.failures import ErrorReport

__all__ = ["EnvPool", "GenerateFn", "Generation", "Rollout", "RolloutManager", "group_plan"]

DEFAULT_MAX_TURNS = 64


@dataclass(frozen=True)
class Generation:
    """One sampled answer: token ids (the stop token included), their log-probs, and the policy version of the
    weights that sampled it."""

    ids: list[int]
    logp: list[float]
    policy_version: int = 0


class GenerateFn(Protocol):
    """One batched generation call: a continuation per prompt, in order. ``vision`` (passed only when a prompt
    shows images): the prompts' per-row vision columns."""

    def __call__(
        self, prompts: list[list[int]], *, seed: int, vision: Mapping[str, list[Any]] | None = None
    ) -> list[Generation]: ...


class EnvPool(Protocol):
    """Env slots driven in batches (one request or None per slot)."""

    @property
    def num_slots(self) -> int: ...

    def reset(self, requests: Sequence[ResetRequest | None]) -> list[ResetOutcome | None]: ...

    def step(self, requests: Sequence[StepRequest | None]) -> list[StepOutcome | None]: ...


@dataclass
class Rollout:
    """The kept episodes of one rollout and what happened to all of them."""

    episodes: list[Episode]
    started: list[Episode] = field(default_factory=list)
    turns: int = 0

    def samples(self, mode: str, gamma: float = 1.0) -> list[Sample]:
        if mode == "step":
            return [s for e in self.episodes for s in step_samples(e, gamma)]
        return [s for e in self.episodes for s in trajectory_samples(e)]

    def metrics(self) -> dict[str, float]:
        return rollout_metrics(self)

    @property
    def errors(self) -> list[ErrorReport]:
        """The reports of every started episode that an env error or timeout ended (shown once per kind)."""
        return [e.report for e in self.started if e.report is not None]


def group_plan(
    config: EnvManagerConfig, num_groups: int, group_size: int, batch_seed: int
) -> list[tuple[int, int]]:
    """``(entry, seed)`` per env, group-major: G consecutive envs share entry and seed. Deterministic."""
    weights = [e.weight for e in config.envs]
    cycle = [i for i, w in enumerate(weights) for _ in range(w)]
    rng = random.Random(batch_seed)
    plan = []
    for g in range(num_groups):
        seed = config.seed_offset + rng.randrange(2**31)
        plan += [(cycle[g % len(cycle)], seed)] * group_size
    return plan


class RolloutManager:
    """Runs rollouts of ``config``'s env mix on ``pool`` with ``generate``. See the module docstring.

    ``max_new_tokens`` is the turn length ``generate`` samples (the run's ``rollout.max_new_tokens``): an episode
    whose next prompt leaves no room for a turn within ``max_context_tokens`` ends (``context_limit``)."""

    def __init__(
        self,
        config: EnvManagerConfig,
        pool: EnvPool,
        generate: GenerateFn,
        encoder: ChatEncoder,
        *,
        max_new_tokens: int,
    ) -> None:
        self.config = config
        self.max_new_tokens = max_new_tokens
        self.pool = pool
        self.generate = generate
        self.encoder = encoder

    def rollout(self, num_groups: int, group_size: int, *, batch_seed: int) -> Rollout:
        """Episodes of ``num_groups`` groups of ``group_size`` envs (plus ``extra_groups`` redundancy)."""
        started = num_groups + self.config.extra_groups
        plan = group_plan(self.config, started, group_size, batch_seed)
        if len(plan) > self.pool.num_slots:
            raise ValueError(
                f"a rollout needs (groups + extra_groups) x group size = {started} x {group_size} = {len(plan)} "
                f"env slots, but the env workers have {self.pool.num_slots}"
            )
        episodes = self._reset(plan, group_size)
        turn = 0
        max_turns = self.config.max_turns or DEFAULT_MAX_TURNS
        while turn < max_turns and not _enough_finished(episodes, num_groups):
            live = [e for e in episodes if e.live]
            if not live:
                break
            self._turn(live, turn, seed=batch_seed * 1009 + turn)
            turn += 1
        for e in episodes:
            if e.live:
                e.finish("turn_limit", turn)
        return Rollout(_first_groups(episodes, num_groups), started=episodes, turns=turn)

    # ---- one phase each ---------------------------------------------------------------------------------

    def _reset(self, plan: list[tuple[int, int]], group_size: int) -> list[Episode]:
        requests: list[ResetRequest | None] = [ResetRequest(entry, seed) for entry, seed in plan]
        requests += [None] * (self.pool.num_slots - len(plan))
        outcomes = self.pool.reset(requests)
        episodes = []
        for i, ((entry, seed), outcome) in enumerate(zip(plan, outcomes)):
            assert outcome is not None  # one outcome per request, by the pool's contract
            episodes.append(self._episode(i, i // group_size, entry, seed, outcome))
        return episodes

    def _episode(self, index: int, group: int, entry: int, seed: int, outcome: ResetOutcome) -> Episode:
        tag = self.config.envs[entry].name
        episode = Episode(index, group, entry, tag, seed, outcome.system_prompt, outcome.valid_actions)
        if outcome.error is not None:
            _failed(episode, outcome.error, outcome.traceback, 0, "reset")
        else:
            episode.start(self.encoder, outcome.observation)
        return episode

    def _turn(self, live: list[Episode], turn: int, seed: int) -> None:
        prompts = {e.index: self._prompt(e) for e in live}
        acting = [e for e in live if e.live]
        if not acting:
            return
        vision = vision_rows([prompts[e.index][1] for e in acting])
        extra = {"vision": vision} if vision else {}
        generations = self.generate([prompts[e.index][0] for e in acting], seed=seed, **extra)
        requests: list[StepRequest | None] = [None] * self.pool.num_slots
        turns = {}
        for episode, gen in zip(acting, generations):
            turns[episode.index] = self._parse(episode, prompts[episode.index], gen)
            requests[episode.index] = StepRequest(turns[episode.index].action or turns[episode.index].text)
        outcomes = self.pool.step(requests)
        for episode in acting:
            outcome = outcomes[episode.index]
            assert outcome is not None
            self._apply(episode, turns[episode.index], outcome, turn)

    def _prompt(self, episode: Episode) -> tuple[list[int], EncodedImages | None]:
        if self.config.mode == "step":
            prompt, images = episode.window_prompt(self.encoder, self.config.history_window)
        else:
            prompt, images = list(episode.ids), episode.conversation_images()
        if len(prompt) + self.max_new_tokens > self.config.max_context_tokens:
            episode.finish("context_limit", len(episode.turns))
        return prompt, images

    def _parse(
        self, episode: Episode, prompt: tuple[list[int], EncodedImages | None], gen: Generation
    ) -> Turn:
        text = self.encoder.decode(gen.ids[:-1] if self.encoder.stopped_on_eos(gen.ids) else gen.ids)
        if episode.valid_actions is not None:
            action, format_ok = parse_action(text, episode.valid_actions, self.config.parse)
        else:
            action, format_ok = None, True  # the env reads the raw text; it reports format in info
        return Turn(
            episode.observation, prompt[0], list(gen.ids), list(gen.logp), text, action, format_ok,
            policy_version=gen.policy_version, observation_images=episode.observation_images,
            prompt_images=prompt[1],
        )  # fmt: skip

    def _apply(self, episode: Episode, turn: Turn, outcome: StepOutcome, turn_index: int) -> None:
        if outcome.result is None:
            episode.turns.append(turn)
            shown = turn.action or turn.text
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            _failed(
                episode,
                outcome.error or "unknown error",
                outcome.traceback,
                turn_index + 1,
                f"step({shown!r})",
            )
            return
        result = outcome.result
        turn.format_ok = turn.format_ok and bool(result.info.get("format_ok", True))
        turn.reward = result.reward + (0.0 if turn.format_ok else self.config.format_penalty)
        turn.info = dict(result.info)
        episode.success = episode.success or bool(result.info.get("success", False))
        episode.add_response(self.encoder, turn)
        if result.done:
            episode.finish("done", turn_index + 1)
        else:
            episode.add_observation(self.encoder, result.observation)


def _failed(episode: Episode, error: str, trace: str | None, turn: int, call: str) -> None:
    """End ``episode`` on an env that raised or timed out, with the report the driver shows and counts."""
    timed_out = error.startswith("timeout")
    episode.finish("timeout" if timed_out else "error", turn, error)
    kind = "timeout" if timed_out else error.split(":", 1)[0]
    where = f"{call} at turn {turn}, episode seed {episode.seed}"
    episode.report = ErrorReport(f"env {episode.tag}", kind, f"{error} [{where}]", trace)


def _groups(episodes: Sequence[Episode]) -> dict[int, list[Episode]]:
    groups: dict[int, list[Episode]] = {}
    for e in episodes:
        groups.setdefault(e.group, []).append(e)
    return groups


def _enough_finished(episodes: Sequence[Episode], num_groups: int) -> bool:
    finished = [g for g in _groups(episodes).values() if not any(e.live for e in g)]
    return len(finished) >= num_groups


def _first_groups(episodes: Sequence[Episode], num_groups: int) -> list[Episode]:
    """Kept episodes of the ``num_groups`` groups that finished first (ties: more kept members, lower index)."""

    def order(item: tuple[int, list[Episode]]) -> tuple[int, int, int]:
        group, members = item
        if any(e.live or e.finished_turn is None for e in members):
            return (1 << 30, 0, group)
        return (max(e.finished_turn or 0 for e in members), -sum(e.kept for e in members), group)

    chosen = sorted(_groups(episodes).items(), key=order)[:num_groups]
    return [e for _, members in sorted(chosen) for e in members if e.kept]


def rollout_metrics(rollout: Rollout) -> dict[str, float]:
    """Success rate, return, turns, format rate and chat-template splits per tag (``env/<tag>/...``) and overall
    (``env/...``), each episode counted once however many segments it was split into; ``env/errors`` is the
    share of started episodes that an env error or timeout ended, ``env/timeouts`` the count of the latter."""
    metrics: dict[str, float] = {}
    by_tag: dict[str, list[Episode]] = {}
    for e in rollout.episodes:
        by_tag.setdefault(e.tag, []).append(e)
    for prefix, eps in [("env", rollout.episodes), *((f"env/{t}", v) for t, v in sorted(by_tag.items()))]:
        metrics.update(_episode_stats(prefix, eps))
    started = rollout.started
    metrics["env/timeouts"] = float(sum(e.status == "timeout" for e in started))
    failed = sum(e.status in ("error", "timeout") for e in started)
    metrics["env/errors"] = failed / max(len(started), 1)  # a rate: roll.core.failures stops on a high one
    metrics["env/context_truncated"] = float(sum(e.status == "context_limit" for e in rollout.episodes))
    metrics["env/episodes_kept"] = float(len(rollout.episodes))
    metrics["env/turns_run"] = float(rollout.turns)
    return metrics


def _episode_stats(prefix: str, episodes: Sequence[Episode]) -> dict[str, float]:
    n = max(len(episodes), 1)
    turns = [t for e in episodes for t in e.turns]
    return {
        f"{prefix}/success_rate": sum(e.success for e in episodes) / n,
        f"{prefix}/return": sum(e.total_reward for e in episodes) / n,
        f"{prefix}/turns": len(turns) / n,
        f"{prefix}/format_ok": sum(t.format_ok for t in turns) / max(len(turns), 1),
        f"{prefix}/template_splits": float(sum(e.splits for e in episodes)),
        f"{prefix}/segments": sum(len(e.segments()) for e in episodes) / n,
    }
