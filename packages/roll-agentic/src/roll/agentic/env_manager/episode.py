"""Episodes as token segments, and the two ways of turning them into training samples.

An :class:`Episode` records, for one env, every turn the model took: the observation it acted on, the token ids
and log-probs it sampled, the parsed action and the reward. In trajectory mode it also grows the conversation's
token ids turn by turn (which is the next prompt), with a loss mask that is 1 exactly on model-sampled tokens.

When the chat template rewrites history (Qwen3 drops earlier turns' ``<think>`` reasoning), the next prompt is
not an extension of what the model saw and produced (:meth:`~.chat.ChatEncoder.next_prompt`): the conversation
is *split*. The tokens so far become a closed :class:`Segment` (it ends with the model's sampled tokens), and a
new segment starts with the whole re-rendered prompt, which is what the model is given next. A prefix-consistent
template never splits: one segment, exactly the conversation as before.

- :func:`trajectory_samples`: one :class:`Sample` per segment (one per episode without splits): the prompt the
  model saw at the segment's first turn, then its turns; trained positions are the model's tokens (its
  end-of-turn token included), never the system prompt, observations or template markup. Every segment of an
  episode carries the episode return and its ``segment`` index; the pipeline computes one advantage per
  trajectory, not per segment (:mod:`roll.agentic.pipeline.agentic.trajectories`).
- :func:`step_samples`: one :class:`Sample` per turn: the windowed prompt the model saw plus its answer, with
  the discounted return from that step and an *anchor* id (a hash of the episode group and the observation the
  step acted on) so GiGPO can group steps taken from the same state by the envs of one group.

Image observations (:class:`~roll.agentic.types.ImageObservation`): the conversation keeps the observation's
text (with its ``<image>`` markers) and the episode collects the images' patches turn by turn
(:class:`~.chat.EncodedImages`); a sample carries the patches of the images its tokens show. Text episodes are
unchanged (no images, no vision columns).

Pure Python (no torch): :mod:`roll.agentic.env_manager.batching` turns samples into a Batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from roll.agentic.env_manager.chat import ChatEncoder, EncodedImages, Message, merge_images
from roll.agentic.types import Observation, split_observation
from roll.core.failures import ErrorReport

__all__ = [
    "Episode",
    "EpisodeStatus",
    "Sample",
    "Segment",
    "Turn",
    "anchor_id",
    "step_samples",
    "trajectory_samples",
]

EpisodeStatus = Literal["running", "done", "turn_limit", "context_limit", "timeout", "error"]
DROPPED: frozenset[str] = frozenset({"timeout", "error"})


@dataclass
class Turn:
    """One model turn: the observation acted on, what was sampled, and what the env answered."""

    observation: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_logp: list[float]
    text: str
    action: str | None
    format_ok: bool
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    policy_version: int = 0
    observation_images: tuple[Any, ...] = ()
    """The observation's images (PIL), when it had any."""
    prompt_images: EncodedImages | None = None
    """The patches of every image ``prompt_ids`` shows (None for text prompts)."""


@dataclass
class Sample:
    """One training row: ``input_ids`` with a 0/1 ``loss_mask`` and the sampler's ``logp`` per position."""

    input_ids: list[int]
    loss_mask: list[int]
    logp: list[float]
    score: float
    group: int
    episode: int
    tag: str
    success: bool
    step: int = 0
    anchor: int = 0
    step_return: float = 0.0
    episode_return: float = 0.0
    policy_version: int = 0
    """The oldest policy version that sampled a trained token of the row (its staleness bound)."""
    images: EncodedImages | None = None
    """The patches of the images the row's tokens show (None for a text row)."""
    segment: int = 0
    """Trajectory mode: which segment of its episode the row is (0 unless the chat template split it)."""


@dataclass
class Segment:
    """A prefix-consistent part of a trajectory: the prompt the model saw at turn ``first_turn``, then turns
    (model tokens, trained) and the template text between them (masked)."""

    first_turn: int
    ids: list[int] = field(default_factory=list)
    trained: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    images: list[EncodedImages] = field(default_factory=list)


@dataclass
class Episode:
    """An env's episode. ``ids``/``trained``/``logp``/``images`` hold the trajectory-mode conversation's current
    segment (the next prompt); ``closed`` the segments a split ended."""

    index: int
    group: int
    entry: int
    tag: str
    seed: int
    system: str
    valid_actions: tuple[str, ...] | None = None
    observation: str = ""
    observation_images: tuple[Any, ...] = ()
    status: EpisodeStatus = "running"
    success: bool = False
    error: str | None = None
    report: ErrorReport | None = None
    """What failed, for the driver to show (its first of each kind) and count: an env that raised or timed out."""
    finished_turn: int | None = None
    turns: list[Turn] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    trained: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    images: list[EncodedImages] = field(default_factory=list)
    closed: list[Segment] = field(default_factory=list)
    segment_start: int = 0
    """The first turn of the current segment."""
    shown_images: list[Any] = field(default_factory=list)
    """Every observation image of the conversation, in order (a split re-encodes them all)."""

    @property
    def live(self) -> bool:
        return self.status == "running"

    @property
    def kept(self) -> bool:
        """False for episodes cut off by a timeout or an env error: they are dropped from the batch."""
        return self.status not in DROPPED and bool(self.turns)

    @property
    def total_reward(self) -> float:
        return sum(t.reward for t in self.turns)

    def start(self, encoder: ChatEncoder, observation: Observation) -> None:
        """The conversation's first prompt: system prompt and first observation, all template (not trained)."""
        self.observation, self.observation_images = split_observation(observation)
        self.messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.observation},
        ]
        self.shown_images = list(self.observation_images)
        ids, images = encoder.prompt_with_images(self.messages, self.observation_images)
        self._append(ids, trained=False, images=images)

    def add_response(self, encoder: ChatEncoder, turn: Turn) -> None:
        """Append the model's sampled tokens (trained) to the conversation."""
        self.turns.append(turn)
        self._append(turn.response_ids, trained=True, logp=turn.response_logp)
        self.messages.append({"role": "assistant", "content": encoder.decode(_without_eos(encoder, turn))})

    def add_observation(self, encoder: ChatEncoder, observation: Observation) -> None:
        """Close the last assistant turn and add the env's answer as the next user turn (template, masked); when
        the template rewrote history, close the segment and start the next one (see the module docstring)."""
        turn = self.turns[-1]
        text, images = split_observation(observation)
        history, content = self.messages[:-1], self.messages[-1]["content"]
        self.shown_images += images
        following = encoder.next_prompt(
            history, content, encoder.stopped_on_eos(turn.response_ids), text, images, self.shown_images
        )
        if following.split:
            self.closed.append(self.current_segment())
            self.ids, self.trained, self.logp, self.images = [], [], [], []
            self.segment_start = len(self.turns)
        self._append(following.ids, trained=False, images=following.images)
        self.messages.append({"role": "user", "content": text})
        self.observation, self.observation_images = text, images

    def current_segment(self) -> Segment:
        return Segment(
            self.segment_start, list(self.ids), list(self.trained), list(self.logp), list(self.images)
        )

    def segments(self) -> list[Segment]:
        """The trajectory's segments that hold a model turn, in order (a split right before the episode ended
        leaves a last prompt that nothing answered: it is not one)."""
        return [s for s in [*self.closed, self.current_segment()] if any(s.trained)]

    @property
    def splits(self) -> int:
        """How many times the chat template's rewrite of history split the conversation."""
        return len(self.closed)

    def finish(self, status: EpisodeStatus, turn: int, error: str | None = None) -> None:
        self.status, self.finished_turn, self.error = status, turn, error

    def window_prompt(self, encoder: ChatEncoder, window: int) -> tuple[list[int], EncodedImages | None]:
        """Step mode's prompt: system, the last ``window`` turns (observation and answer), the observation; and
        the patches of the images it shows."""
        messages: list[Message] = [{"role": "system", "content": self.system}]
        images: list[Any] = []
        for turn in self.turns[len(self.turns) - window :] if window else []:
            messages.append({"role": "user", "content": turn.observation})
            messages.append({"role": "assistant", "content": turn.text})
            images += turn.observation_images
        messages.append({"role": "user", "content": self.observation})
        return encoder.prompt_with_images(messages, [*images, *self.observation_images])

    def conversation_images(self) -> EncodedImages | None:
        """The patches of every image of the trajectory-mode conversation's current segment (None without
        images)."""
        return merge_images(self.images)

    def _append(
        self,
        ids: Sequence[int],
        *,
        trained: bool,
        logp: Sequence[float] | None = None,
        images: EncodedImages | None = None,
    ) -> None:
        if images is not None:
            self.images.append(images)
        self.ids += list(ids)
        self.trained += [int(trained)] * len(ids)
        self.logp += list(logp) if logp is not None else [0.0] * len(ids)


def _without_eos(encoder: ChatEncoder, turn: Turn) -> list[int]:
    ids = turn.response_ids
    return ids[:-1] if encoder.stopped_on_eos(ids) else list(ids)


def anchor_id(group: int, observation: str) -> int:
    """A stable 63-bit id of (episode group, state): equal states of one group share it (GiGPO's anchors)."""
    digest = hashlib.blake2b(f"{group}\x00{observation}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def trajectory_samples(episode: Episode) -> list[Sample]:
    """One row per segment (see the module docstring); every row carries the episode return as its score."""
    segments = episode.segments()
    ends = [s.first_turn for s in segments[1:]] + [len(episode.turns)]
    return [
        Sample(
            input_ids=list(seg.ids),
            loss_mask=list(seg.trained),
            logp=list(seg.logp),
            score=episode.total_reward,
            group=episode.group,
            episode=episode.index,
            tag=episode.tag,
            success=episode.success,
            step=len(episode.turns),
            episode_return=episode.total_reward,
            policy_version=min((t.policy_version for t in episode.turns[seg.first_turn : end]), default=0),
            images=merge_images(seg.images),
            segment=k,
        )
        for k, (seg, end) in enumerate(zip(segments, ends))
    ]


def step_samples(episode: Episode, gamma: float = 1.0) -> list[Sample]:
    """One row per turn: its prompt and answer, the discounted return from it and its anchor id."""
    returns = _discounted([t.reward for t in episode.turns], gamma)
    samples = []
    for k, (turn, ret) in enumerate(zip(episode.turns, returns)):
        prompt, response = turn.prompt_ids, turn.response_ids
        samples.append(
            Sample(
                input_ids=prompt + response,
                loss_mask=[0] * len(prompt) + [1] * len(response),
                logp=[0.0] * len(prompt) + list(turn.response_logp),
                score=episode.total_reward,
                group=episode.group,
                episode=episode.index,
                tag=episode.tag,
                success=episode.success,
                step=k,
                anchor=anchor_id(episode.group, _state_key(turn)),
                step_return=ret,
                episode_return=episode.total_reward,
                policy_version=turn.policy_version,
                images=turn.prompt_images,
            )
        )
    return samples


def _state_key(turn: Turn) -> str:
    """The state a turn acted on: its observation text, plus its images' bytes when it had any (an image
    observation's text alone does not tell states apart)."""
    if not turn.observation_images:
        return turn.observation
    digest = hashlib.blake2b(digest_size=16)
    for image in turn.observation_images:
        digest.update(image.tobytes())
    return f"{turn.observation}\x00{digest.hexdigest()}"


def _discounted(rewards: Sequence[float], gamma: float) -> list[float]:
    out, running = [0.0] * len(rewards), 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = rewards[k] + gamma * running
        out[k] = running
    return out
