"""Config of the env managers: which envs, how turns are sampled and cut off. Light: pydantic only.

Group sizes are not here: a rollout batch is ``batch.prompts_per_step`` groups of ``batch.samples_per_prompt``
envs (the pipeline's :class:`~roll.core.config.batch.BatchConfig` states them once); the G envs of a group share
one seed, so their episodes start from the same state and form a GRPO group. Nor is sampling: a turn's length,
temperature and nucleus are the run's ``rollout.*`` (:class:`~roll.core.config.sampling.SamplingConfig`), the key
path every RL mode shares.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, JsonValue, field_validator

from roll.agentic.parsing import ActionParseConfig
from roll.agentic.tools.wrapper import ToolWrapperConfig
from roll.core.config.base import RollModel

__all__ = ["RESERVED_TEMPLATE_KWARGS", "EnvEntryConfig", "EnvManagerConfig", "ManagerMode", "ToolEntryConfig"]

ManagerMode = Literal["trajectory", "step"]
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"conversation", "messages", "tokenize", "add_generation_prompt", "continue_final_message", "chat_template",
     "return_dict", "return_tensors", "return_assistant_tokens_mask", "padding", "truncation", "max_length",
     "tokenizer_kwargs"}
)  # fmt: skip
"""``apply_chat_template`` arguments the chat encoder sets itself (or that change what it returns)."""


class ToolEntryConfig(RollModel):
    """One tool an env entry gives the policy: a ``roll.tool`` entry point and its options."""

    type: str = Field(min_length=1, description="roll.tool entry point: calculator, python, mcp, ...")
    options: dict[str, Any] = Field(
        default_factory=dict, description="the tool's config fields (its ToolSpec config_model)"
    )


class EnvEntryConfig(RollModel):
    """One env of the mix: a ``roll.env`` entry point, its config fields and the tag its metrics carry."""

    type: str = Field(min_length=1, description="roll.env entry point: sokoban, frozen_lake, countdown, ...")
    options: dict[str, Any] = Field(
        default_factory=dict, description="the env's config fields (its EnvSpec config_model)"
    )
    tag: str | None = Field(None, description="metric and reward-normalization tag; default: type")
    weight: int = Field(1, ge=1, description="share of the groups of a batch that use this env")
    tools: list[ToolEntryConfig] = Field(
        default_factory=list,
        description="roll.tool plugins the policy may call in this env's turns (in the tool_calls.format); their "
        "results come back as observations",
    )
    tool_calls: ToolWrapperConfig = Field(
        default_factory=ToolWrapperConfig,
        description="format, limits and rewards of the tool calls (with tools)",
    )

    @property
    def name(self) -> str:
        return self.tag or self.type


class EnvManagerConfig(RollModel):
    """How episodes are run and turned into training samples.

    ``mode``: ``trajectory`` makes one sample per episode (the whole chat-templated conversation; the loss covers
    only tokens the model generated; the episode's reward sits on the last of them); ``step`` makes one sample
    per turn (the prompt holds the system prompt plus the last ``history_window`` turns), with per-step anchor
    states for GiGPO.
    """

    mode: ManagerMode = Field(
        "trajectory",
        description="trajectory: one sample per episode; step: one sample per turn (GiGPO needs it)",
    )
    envs: list[EnvEntryConfig] = Field(
        default_factory=lambda: [EnvEntryConfig(type="guess_direction")], min_length=1
    )
    max_turns: int | None = Field(
        None, ge=1, description="turn cap per episode; default: the env's max_steps"
    )
    max_context_tokens: int = Field(
        2048,
        ge=16,
        description="an episode whose next prompt + turn (rollout.max_new_tokens) would not fit is truncated",
    )
    format_penalty: float = Field(
        -0.1, le=0.0, description="added to a turn's reward when the output broke the answer format"
    )
    step_timeout_s: float = Field(
        30.0, gt=0, description="an env whose reset/step takes longer is cut off; its episode is dropped"
    )
    extra_groups: int = Field(
        0, ge=0, description="redundancy: groups started beyond the batch; the first to finish are kept"
    )
    history_window: int = Field(2, ge=0, description="step mode: past turns shown in each prompt")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="step mode: discount of step returns")
    parse: ActionParseConfig = Field(default_factory=ActionParseConfig)
    chat_template_kwargs: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="variables of the policy tokenizer's chat template, passed to apply_chat_template on every "
        "render (prompts, split detection, warm-up, evaluation), e.g. {enable_thinking: false} for Qwen3; checked "
        "at startup by rendering a one-turn conversation: a name the template never reads, or a value it raises "
        "on, stops the run naming the key",
    )
    seed_offset: int = Field(
        0, ge=0, description="added to env seeds (held-out evaluation uses another range)"
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _not_reserved(cls, kwargs: dict[str, JsonValue]) -> dict[str, JsonValue]:
        reserved = sorted(RESERVED_TEMPLATE_KWARGS & kwargs.keys())
        if reserved:
            raise ValueError(
                f"{', '.join(reserved)}: set by the chat encoder itself, not a template variable; "
                "chat_template_kwargs holds only the template's own variables (enable_thinking, ...)"
            )
        return kwargs
