"""The typed interfaces of roll's agentic side: environments, tools, and what they return.

Map of the abstractions:

- :class:`Env` is a multi-turn, text-in/text-out environment with gymnasium's conventions: ``reset(seed)``
  gives the first observation, ``step(action)`` a :class:`StepResult` whose ``terminated`` means the episode
  ended by its own rules (win, hole, answer submitted) and ``truncated`` means it was cut off (``max_steps``).
  An env also tells the model how to act (``system_prompt``, ``action_space_text``) and can draw itself
  (``render("text")`` always, ``render("rgb_array")`` where a picture exists).
- :class:`Tool` is a function the model may call: a name, a description and a JSON-schema ``parameters``
  object (the OpenAI/Qwen function format), and ``call(arguments) -> ToolResult``. Tools report failures in the
  result (``ok=False``) rather than raising, because the model should see the error and recover.
- :class:`ToolParser` is a tool-call *format* (a ``roll.tool_parser`` plugin: hermes, qwen3_coder, llama3_json,
  mistral): the system-prompt section that describes the tools, how an assistant turn writes :class:`ToolCall`
  objects (``render``) and how they are read back from a model's output (``parse``, giving
  :class:`ParsedToolCalls`, whose malformed calls are :class:`ToolCallError` values the model reads as the
  tool's answer). :mod:`roll.agentic.tool_parsers` finds them by name.
- :class:`~roll.agentic.tools.wrapper.ToolEnvWrapper` composes the two: it is itself an :class:`Env` that runs
  tool calls found in the model's output and passes every other action to the env it wraps.
- Env configs are :class:`~roll.core.config.base.RollModel` subclasses with a ``type`` discriminator equal to
  their ``roll.env`` entry-point name (:class:`EnvConfig`); each env module exposes an
  :class:`~roll.core.types.EnvSpec` in :mod:`roll.agentic.envs.specs`, each tool a
  :class:`~roll.core.types.ToolSpec` in :mod:`roll.agentic.tools.specs`.
- ``info`` dicts may carry :data:`EXPERT_ACTION`: the action an expert would take in the state just reached
  (after ``reset`` and after every step that does not end the episode). Envs that know it (FrozenLake by BFS,
  guess_direction) report it; the agentic warm-up imitates it for a fraction of its answers.
- Env managers (which batch envs, prompt a policy and apply format penalties) consume these interfaces; they
  live elsewhere and import nothing below this module but the interfaces.

Envs are deliberately not thread-safe and not picklable mid-episode: an env manager owns each instance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, runtime_checkable

from pydantic import Field

from roll.core.config.base import RollModel
from roll.core.errors import RollError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = [
    "EXPERT_ACTION",
    "IMAGE_MARKER",
    "Env",
    "EnvConfig",
    "EnvError",
    "Frame",
    "ImageObservation",
    "Observation",
    "ParsedToolCalls",
    "RenderMode",
    "StepResult",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolError",
    "ToolParser",
    "ToolResponse",
    "ToolResult",
    "split_observation",
    "tool_schema",
]

EXPERT_ACTION = "expert_action"
"""``info`` key: the action an expert would take in the current state (optional, see the module docstring)."""

IMAGE_MARKER = "<image>"
"""Where an :class:`ImageObservation`'s image goes in its text (one marker per image)."""


@dataclass(frozen=True)
class ImageObservation:
    """An observation for a vision-language policy: ``text`` with one :data:`IMAGE_MARKER` per image of
    ``images`` (PIL images, in marker order). The env manager puts the images' vision tokens at the markers and
    sends the patches to the policy with the prompt."""

    text: str
    images: tuple[Any, ...]

    def __post_init__(self) -> None:
        if self.text.count(IMAGE_MARKER) != len(self.images):
            raise EnvError(
                f"an ImageObservation needs one {IMAGE_MARKER} per image: the text has "
                f"{self.text.count(IMAGE_MARKER)}, there are {len(self.images)} image(s)"
            )


Observation: TypeAlias = "str | ImageObservation"
"""What the policy sees after reset or a step: plain text, ready to go into a chat message, or text with images
(:class:`ImageObservation`)."""


def split_observation(observation: Observation) -> tuple[str, tuple[Any, ...]]:
    """``(text, images)`` of an observation (a text observation has no images)."""
    if isinstance(observation, ImageObservation):
        return observation.text, observation.images
    return observation, ()


RenderMode = Literal["text", "rgb_array"]

Frame: TypeAlias = "str | NDArray[np.uint8]"
"""``render("text")`` returns ``str``; ``render("rgb_array")`` an ``[H, W, 3]`` uint8 array."""


class EnvError(RollError, RuntimeError):
    """An env used against its contract: stepping a finished episode, an unsupported render mode, a level that
    cannot be generated with the given sizes."""


class ToolError(RollError, RuntimeError):
    """A tool that cannot be built or reached (an MCP server that does not start). Errors *inside* a call are
    not raised: they come back as ``ToolResult(ok=False)`` so the model can read them."""


@dataclass(frozen=True)
class StepResult:
    """The outcome of one :meth:`Env.step`, in gymnasium's five-tuple shape (minus the tuple).

    ``terminated``: the episode ended by the env's rules; ``truncated``: it was cut off (step limit). A trainer
    bootstraps values after truncation but not after termination, so the two must not be conflated.
    """

    observation: Observation
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@runtime_checkable
class Env(Protocol):
    """A text environment. See the module docstring for the conventions."""

    max_steps: int
    """Steps after which ``step`` reports ``truncated=True``."""

    @property
    def system_prompt(self) -> str:
        """Instructions for the policy: the task, the rules and the answer format."""
        ...

    @property
    def action_space_text(self) -> str:
        """One line naming the valid actions, e.g. ``"Valid actions: Up, Down, Left, Right"``."""
        ...

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        """Start an episode. The same ``seed`` gives the same episode; ``None`` draws one from the env's RNG."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply one action. Raises :class:`EnvError` if the episode is over."""
        ...

    def render(self, mode: RenderMode = "text") -> Frame:
        """The current state as text (``str``) or as an ``[H, W, 3]`` uint8 array (:data:`Frame`)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returns to the model: ``text`` goes into ``<tool_response>``; ``ok`` is False when the
    call failed (bad arguments, a runtime error, a timeout)."""

    text: str
    ok: bool = True


@runtime_checkable
class Tool(Protocol):
    """A callable tool, described in the OpenAI/Qwen function-calling format."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> dict[str, Any]:
        """A JSON schema of type ``object`` describing ``arguments``."""
        ...

    def call(self, arguments: dict[str, Any]) -> ToolResult: ...

    def close(self) -> None:
        """Free what the tool holds (a server process); a no-op for pure tools."""
        ...


class ToolCallError(RollError, ValueError):
    """A malformed tool call in a model's output: truncated, not parseable, an unknown function, bad arguments.

    Not raised by :meth:`ToolParser.parse` (it returns these among the calls, so the well-formed calls of the same
    turn still run); :meth:`ParsedToolCalls.checked` raises the first. The message is written for the model: the
    env wrapper answers the call with ``format error: <message>``."""


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: the function ``name``, its ``arguments`` (a JSON object) and, in formats that carry
    one (mistral), the call's ``id``."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class ToolResponse:
    """A tool's answer to one call, as :meth:`ToolParser.render_responses` writes it back to the model."""

    text: str
    name: str | None = None
    call_id: str | None = None


@dataclass(frozen=True)
class ParsedToolCalls:
    """What :meth:`ToolParser.parse` found in one model output.

    ``items``: one entry per call the text attempts, in order, each a :class:`ToolCall` or the
    :class:`ToolCallError` that says what is wrong with it; empty when the text makes no call (then it is an
    ordinary answer). ``content``: the text outside the calls (what an OpenAI message's ``content`` holds)."""

    content: str
    items: tuple[ToolCall | ToolCallError, ...] = ()

    @property
    def calls(self) -> list[ToolCall]:
        return [item for item in self.items if isinstance(item, ToolCall)]

    @property
    def errors(self) -> list[ToolCallError]:
        return [item for item in self.items if isinstance(item, ToolCallError)]

    def checked(self) -> list[ToolCall]:
        """Every call, or raise the first :class:`ToolCallError` (a gateway that answers all or nothing)."""
        errors = self.errors
        if errors:
            raise errors[0]
        return self.calls


@runtime_checkable
class ToolParser(Protocol):
    """A tool-call format, built for one set of tools (``roll.core.types.ToolParserBuild``).

    Contract: ``parse(render(calls)).calls == calls`` for calls of known tools whose argument values the format
    can carry (each format's docstring says which it cannot); ``parse`` never raises for bad model output."""

    name: str

    def tools_prompt(self, note: str = "") -> str:
        """The system-prompt section that lists the tools and shows the call format, as the format's chat template
        writes it; ``note`` (one sentence, such as a call limit) goes after its opening line."""
        ...

    def render(self, calls: Sequence[ToolCall]) -> str:
        """``calls`` as an assistant turn of this format writes them (what ``parse`` reads)."""
        ...

    def parse(self, text: str) -> ParsedToolCalls:
        """The calls in a model's output (see :class:`ParsedToolCalls`)."""
        ...

    def render_responses(self, responses: Sequence[ToolResponse]) -> str:
        """The tools' answers to one turn's calls, in order, as the format's template shows tool results."""
        ...


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The tool as the ``{"type": "function", "function": {...}}`` object chat templates expect."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


class EnvConfig(RollModel):
    """Base of env configs: ``type`` names the env (its ``roll.env`` entry point); subclasses narrow it to a
    ``Literal`` so a union of configs discriminates on it."""

    type: str
    max_steps: int = Field(default=20, ge=1, description="steps after which the episode is truncated")
