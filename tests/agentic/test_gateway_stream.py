"""``stream: true`` through the real ``openai`` client's streaming APIs: the raw chunk iterator
(``chat.completions.create(stream=True)``) and the client's accumulating helper (``chat.completions.stream``),
for a tool call and for a plain answer, with ``n=2``.

The policy is scripted (a Hermes ``lookup`` call while the prompt holds no tool result, then the result's
digit), so what the stream must carry is known; the server, the client and the parser are the real ones.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.manager import Generation
from roll.agentic.gateway.agents import AgentGateway
from roll.agentic.gateway.config import GatewayConfig
from roll.agentic.gateway.lookup import CALL_TEXT, TOOL
from roll.workers.config import SamplingParams

# the roll-agentic[openai] extra (in the dev group): the per-package check installs roll-agentic without it
openai = pytest.importorskip("openai", reason="the OpenAI client is the roll-agentic[openai] extra")

FIRST = [{"role": "user", "content": "What is the secret digit?"}]
CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
AFTER = [*FIRST, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "c1", "content": "7"}]  # fmt: skip


@pytest.fixture(scope="module")
def encoder() -> ChatEncoder:
    from transformers import AutoTokenizer

    from roll.data.tiny import tiny_model_path

    return ChatEncoder(AutoTokenizer.from_pretrained(tiny_model_path("tiny-1m")))


class ScriptedLookup:
    def __init__(self, encoder: ChatEncoder) -> None:
        self.encoder = encoder

    def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams
    ) -> list[list[Generation]]:
        out = []
        for prompt in prompts:
            text = self.encoder.decode(prompt)
            answer = text.split("<tool_response>\n")[-1][0] if "<tool_response>" in text else CALL_TEXT
            ids = [*self.encoder.encode(answer), self.encoder.eos_token_id]
            out.append([Generation(ids, [-0.5] * len(ids), 0)] * params.n)
        return out


def _in_one_episode(encoder: ChatEncoder, agent: Any) -> Any:
    seen: dict[str, Any] = {}

    def play(base_url: str, api_key: str, task: dict[str, Any]) -> float:
        seen["result"] = agent(openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60))
        return 0.0

    with AgentGateway(GatewayConfig(), encoder, ScriptedLookup(encoder), play) as gateway:
        rollout = gateway.rollout([{}], 1, seed=0)
    assert not rollout.errors, rollout.errors[0].traceback
    return seen["result"], rollout.episodes[0]


def test_stream_chunks_carry_tool_calls_content_and_finish_reasons(encoder: ChatEncoder) -> None:
    """Raw chunks, ``n=2``: each choice's deltas hold the role, then the tool call (index 0, an id, ``lookup``
    with ``{}``) and no content, then ``finish_reason`` ``tool_calls``, after which the iterator ends ([DONE]);
    after the tool result, the deltas spell the digit and end on ``stop``. The streamed calls are recorded like
    the others."""

    def agent(client: Any) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for name, messages in (("call", FIRST), ("answer", AFTER)):
            stream = client.chat.completions.create(
                model="policy", messages=messages, tools=[TOOL], n=2, stream=True
            )
            out[name] = list(stream)
        return out

    chunks, episode = _in_one_episode(encoder, agent)
    for name in ("call", "answer"):
        assert {c.object for c in chunks[name]} == {"chat.completion.chunk"}
        assert sorted({ch.index for c in chunks[name] for ch in c.choices}) == [0, 1]
    for index in (0, 1):
        call = [ch for c in chunks["call"] for ch in c.choices if ch.index == index]
        assert [ch.finish_reason for ch in call][-1] == "tool_calls"
        assert all(ch.finish_reason is None for ch in call[:-1])
        assert {ch.delta.role for ch in call} - {None} == {"assistant"}
        assert "".join(ch.delta.content or "" for ch in call) == ""
        (tool_call,) = [t for ch in call for t in ch.delta.tool_calls or []]
        assert tool_call.index == 0 and tool_call.id and tool_call.type == "function"
        assert tool_call.function.name == "lookup" and json.loads(tool_call.function.arguments) == {}
        answer = [ch for c in chunks["answer"] for ch in c.choices if ch.index == index]
        assert "".join(ch.delta.content or "" for ch in answer) == "7"
        assert [ch.finish_reason for ch in answer][-1] == "stop"
        assert not any(ch.delta.tool_calls for ch in answer)
    assert [c.endpoint for c in episode.calls] == ["chat", "chat"]
    assert [len(c.choices) for c in episode.calls] == [2, 2]


def test_stream_helper_accumulates_the_tool_call(encoder: ChatEncoder) -> None:
    """The client's own accumulator (``chat.completions.stream``) rebuilds from the chunks what the non-streamed
    call returns: the ``lookup`` call (``finish_reason`` ``tool_calls``), then the answer ``7`` (``stop``)."""

    def agent(client: Any) -> list[Any]:
        finals = []
        for messages in (FIRST, AFTER):
            with client.chat.completions.stream(model="policy", messages=messages, tools=[TOOL]) as stream:
                events = [e.type for e in stream]
                finals.append((events, stream.get_final_completion()))
            finals.append(
                (None, client.chat.completions.create(model="policy", messages=messages, tools=[TOOL]))
            )
        return finals

    finals, _ = _in_one_episode(encoder, agent)
    (call_events, call), (_, call_plain), (_, answer), (_, answer_plain) = finals
    assert "tool_calls.function.arguments.done" in call_events
    for streamed, plain in ((call, call_plain), (answer, answer_plain)):
        assert streamed.choices[0].finish_reason == plain.choices[0].finish_reason
        assert streamed.choices[0].message.content == plain.choices[0].message.content
    assert call.choices[0].finish_reason == "tool_calls"
    (tool_call,) = call.choices[0].message.tool_calls
    assert tool_call.function.name == "lookup" and tool_call.function.arguments == "{}"
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content == "7"
