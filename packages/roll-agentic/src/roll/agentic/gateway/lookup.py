"""A task whose answer needs a tool call, and an OpenAI-client agent that plays it (``roll.agent`` ``lookup``).

Each task row hides a secret digit (drawn per row, so no policy can know it): the question carries nothing of
it, and the only way to the answer is the ``lookup`` tool, whose result is the digit. The agent is ordinary
OpenAI-SDK code: it asks the model, runs the tool calls the model makes (appending the ``tool`` messages), asks
again, and scores the final answer 1 if it is the secret digit, else 0. A policy that answers without the tool
guesses (1 in 10); one that calls it and copies its result is right.

:func:`warmup_conversations` builds SFT conversations for a warm-up that teaches the *format* (a tool call, or a
bare digit) and reading a tool result (``reading_fraction`` of them), with the tool called in a ``tool_fraction`` of
first answers: RL must then learn to call it always.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from roll.core.config.base import RollModel
from roll.core.types import AgentSpec

__all__ = [
    "LOOKUP",
    "LookupAgentConfig",
    "lookup_agent",
    "lookup_tasks",
    "warmup_conversations",
]

SYSTEM = "Answer with one digit."
QUESTION = "What is the secret digit?"
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "the secret digit",
        "parameters": {"type": "object", "properties": {}},
    },
}
CALL_TEXT = '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'


class LookupAgentConfig(RollModel):
    """Options of the ``lookup`` agent."""

    show_tools: bool = Field(
        True, description="send the tool's schema in the request (false: the policy learned the tool)"
    )
    max_turns: int = Field(3, ge=1, description="model calls per episode at most")
    timeout_s: float = Field(60.0, gt=0, description="the OpenAI client's timeout per request")


def lookup_tasks(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` task rows ``{"question", "secret"}`` with secrets drawn from ``seed``."""
    rng = random.Random(seed)
    return [{"question": QUESTION, "secret": str(rng.randrange(10))} for _ in range(count)]


def lookup_agent(config: LookupAgentConfig | None = None) -> Any:
    """The agent callable (see the module docstring); needs the ``openai`` package."""
    cfg = config or LookupAgentConfig()

    def agent(base_url: str, api_key: str, task: Mapping[str, Any]) -> float:
        import openai

        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=cfg.timeout_s)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": str(task["question"])},
        ]
        extra = {"tools": [TOOL]} if cfg.show_tools else {}
        for _ in range(cfg.max_turns):
            reply = client.chat.completions.create(model="policy", messages=messages, **extra)  # type: ignore[call-overload]
            message = reply.choices[0].message
            if not message.tool_calls:
                return float((message.content or "").strip() == task["secret"])
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                result = (
                    task["secret"] if call.function.name == "lookup" else f"unknown tool {call.function.name}"
                )
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return 0.0

    return agent


def warmup_conversations(
    count: int,
    rng: random.Random,
    *,
    tool_fraction: float,
    show_tools: bool = True,
    reading_fraction: float = 0.5,
) -> list[dict[str, Any]]:
    """OpenAI-format conversations (``{"messages", "tools"}``, the last message the answer to learn): an answer
    after a tool result that copies it (``reading_fraction`` of them), else a first answer that calls the tool
    (``tool_fraction`` of those) or guesses a digit. What the ``agent_gateway`` pipeline's ``warmup.path`` holds,
    one per line.

    ``reading_fraction``: the share of conversations that read a tool result and copy it. The guessed digits of
    the first answers teach "any digit" in a context a few tokens from the reading one, and tiny-1m's copy comes
    late under them: ``scripts/lookup_copy_probe.py --mixed`` (300 steps x 32 at lr 1e-3) copies 7/10 digits at
    0.5 (64 rows), 10/10 at 0.9 (128 or 256 rows); see docs/agent_gateway.md."""
    first: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    call = {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    out = []
    for _ in range(count):
        if rng.random() >= reading_fraction:
            answer: dict[str, Any] = {"role": "assistant", "content": str(rng.randrange(10))}
            if rng.random() < tool_fraction:
                answer = {"role": "assistant", "content": None, "tool_calls": [call]}
            messages = [*first, answer]
        else:
            digit = str(rng.randrange(10))
            messages = [*first, {"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": "c", "content": digit},
                        {"role": "assistant", "content": digit}]  # fmt: skip
        out.append({"messages": messages, **({"tools": [TOOL]} if show_tools else {})})
    return out


LOOKUP = AgentSpec(
    name="lookup",
    build=lambda config: lookup_agent(config),
    config_model=LookupAgentConfig,
    description="the secret-digit lookup task: the answer needs a tool call (OpenAI SDK agent)",
)
