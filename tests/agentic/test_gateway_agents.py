"""An OpenAI Agents SDK agent (the ``roll-agentic[agents]`` extra) runs unmodified against the gateway: the SDK's
own ``Agent``, ``Runner`` and ``@function_tool``, on ``OpenAIChatCompletionsModel`` over an ``AsyncOpenAI``
client at the episode's ``base_url`` (the SDK's documented way to use another OpenAI-compatible endpoint),
tracing off. No network: every test here runs under a guard that refuses (and records) any connection or name
lookup off the loopback interface, and checks at the end that none was tried.

Two policies. The tiny-1m model in process samples what it samples (it never writes a Hermes tool call: it is
random-initialised), so it shows the SDK's plain path and that the rows hold exactly the sampled ids. The tool
round trip (the SDK parses the call, runs its tool function, sends the result back, reads the answer) is shown
with a scripted policy that writes a real Hermes ``<tool_call>`` when the prompt has no tool result yet and the
result's digit when it has, once through ``Runner.run_sync`` and once streamed (``Runner.run_streamed``).
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.manager import Generation
from roll.agentic.gateway.agents import AgentGateway
from roll.agentic.gateway.config import GatewayConfig, GatewaySamplingConfig
from roll.agentic.gateway.lookup import CALL_TEXT, QUESTION, SYSTEM
from roll.agentic.gateway.sampler import LocalSampler, Sampler
from roll.workers.config import SamplingParams

# the roll-agentic[openai] and [agents] extras (in the dev group): the per-package check installs neither
openai = pytest.importorskip("openai", reason="the OpenAI client is the roll-agentic[openai] extra")
agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK is the roll-agentic[agents] extra")

TASKS = [{"question": QUESTION, "secret": secret} for secret in "73"]
LOOPBACK = {"127.0.0.1", "::1", "localhost"}


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Refuse every connect and name lookup to a host off the loopback interface; fail the test if any was
    tried (the SDK could swallow the refusal, so the attempts are counted, not only refused)."""
    tried: list[str] = []
    connect, connect_ex, getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def off_loopback(host: Any) -> bool:
        return isinstance(host, str) and host not in LOOPBACK

    def guarded(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(sock: socket.socket, address: Any) -> Any:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and off_loopback(address[0]):
                tried.append(f"connect {address}")
                raise ConnectionRefusedError(f"test guard: no network ({address})")
            return real(sock, address)

        return call

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        if off_loopback(host.decode() if isinstance(host, bytes) else host):
            tried.append(f"getaddrinfo {host}")
            raise socket.gaierror(f"test guard: no name lookups ({host})")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded(connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(connect_ex))
    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    yield tried
    assert tried == [], f"network use outside 127.0.0.1: {tried}"


@pytest.fixture(scope="module")
def tiny() -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll.data.tiny import tiny_model_path

    path = tiny_model_path("tiny-1m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    return {"tokenizer": tokenizer, "model": AutoModelForCausalLM.from_pretrained(path),
            "encoder": ChatEncoder(tokenizer)}  # fmt: skip


class Recorded:
    """A sampler that keeps every ``(prompt, generation)`` its inner sampler returned."""

    def __init__(self, inner: Sampler) -> None:
        self.inner, self.sampled = inner, []

    def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams
    ) -> list[list[Generation]]:
        out = self.inner(prompts, seeds, params)
        self.sampled += [(list(p), g.ids) for p, gens in zip(prompts, out) for g in gens]
        return out


class ScriptedLookup:
    """The policy of the lookup task played perfectly: a Hermes call of ``lookup`` while the prompt holds no tool
    result, then the result's first character."""

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
            out.append([Generation(ids, [-0.5] * len(ids), 2)] * params.n)
        return out


def sdk_agent(outcomes: dict[int, dict[str, Any]], *, stream: bool = False) -> Any:
    """A user's Agents-SDK agent with one tool, ``lookup``; it returns ``1 + 0.25 * tool runs`` when the final
    answer is the secret, else ``len(answer) / 100``, and leaves what the SDK gave it in ``outcomes``."""

    def play(base_url: str, api_key: str, task: dict[str, Any]) -> float:
        runs: list[str] = []

        @agents.function_tool
        def lookup() -> str:
            """The secret digit."""
            runs.append(task["secret"])
            return str(task["secret"])

        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
        model = agents.OpenAIChatCompletionsModel(model="policy", openai_client=client)
        agent = agents.Agent(name="lookup", instructions=SYSTEM, tools=[lookup], model=model)
        config = agents.RunConfig(tracing_disabled=True)
        if stream:
            result = asyncio.run(_streamed(agent, task["question"], config))
        else:
            result = agents.Runner.run_sync(agent, task["question"], max_turns=3, run_config=config)
        answer = str(result.final_output)
        reward = 1.0 + 0.25 * len(runs) if answer.strip() == task["secret"] else len(answer) / 100
        episode = int(re.search(r"/episodes/(\d+)/", base_url).group(1))  # type: ignore[union-attr]
        items = [type(i).__name__ for i in result.new_items]
        outcomes[episode] = {"answer": answer, "tool_runs": runs, "items": items, "reward": reward}
        return reward

    return play


async def _streamed(agent: Any, question: str, config: Any) -> Any:
    result = agents.Runner.run_streamed(agent, question, max_turns=3, run_config=config)
    async for _ in result.stream_events():
        pass
    return result


@pytest.mark.parametrize("stream", [False, True], ids=["run_sync", "run_streamed"])
def test_agents_sdk_tool_call_round_trips(tiny: dict[str, Any], stream: bool) -> None:
    """The scripted policy writes a Hermes call; the SDK turns it into a ``ToolCallItem``, runs its own
    ``lookup`` function once, sends the result back (the second prompt holds it as ``<tool_response>``) and takes
    the digit as its final output: reward 1.25 for each of the 4 episodes, recorded as returned, 2 rows each."""
    enc = tiny["encoder"]
    outcomes: dict[int, dict[str, Any]] = {}
    with AgentGateway(GatewayConfig(), enc, ScriptedLookup(enc), sdk_agent(outcomes, stream=stream)) as gw:
        rollout = gw.rollout(TASKS, 2, seed=3)
    assert not rollout.errors, rollout.errors[0].traceback
    assert [e.reward for e in rollout.started] == [outcomes[i]["reward"] for i in range(4)] == [1.25] * 4
    for episode in rollout.episodes:
        secret = episode.task["secret"]
        seen = outcomes[episode.index]
        assert seen["tool_runs"] == [secret] and seen["answer"] == secret
        assert seen["items"] == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
        first, second = (enc.decode(c.prompt_ids) for c in episode.calls)
        assert '"name": "lookup"' in first and "<tool_response>" not in first
        assert f"<tool_response>\n{secret}\n</tool_response>" in second and CALL_TEXT in second
    rows = rollout.samples()
    assert len(rows) == 8 and {r.score for r in rows} == {1.25}
    for row, call in zip(rows, [c for e in rollout.episodes for c in e.calls]):
        assert row.input_ids == call.prompt_ids + call.choices[0].ids


def test_agents_sdk_drives_the_tiny_policy(tiny: dict[str, Any]) -> None:
    """The SDK agent on tiny-1m (4 episodes, sampled at T=1): the model never calls the tool, so each episode is
    one call whose final output is the text of what the model sampled; the recorded rows are exactly the
    sampled ids (prompt + sampled, loss on the sampled ones) and each episode's reward is what its agent
    returned."""
    from roll.workers.hf_infer import HFInferStrategy

    enc = tiny["encoder"]
    sampler = Recorded(LocalSampler(HFInferStrategy(tiny["model"], tokenizer=tiny["tokenizer"])))
    outcomes: dict[int, dict[str, Any]] = {}
    with AgentGateway(
        GatewayConfig(), enc, sampler, sdk_agent(outcomes), sampling=GatewaySamplingConfig(max_new_tokens=8)
    ) as gw:
        rollout = gw.rollout(TASKS, 2, seed=11)
    assert not rollout.errors, rollout.errors[0].traceback
    assert len(rollout.episodes) == 4 and len(sampler.sampled) == 4
    rows = rollout.samples()
    split = [_prompt_and_response(row) for row in rows]
    assert sorted(split) == sorted(sampler.sampled), "the rows are not prompt + sampled ids"
    for episode in rollout.episodes:
        (call,) = episode.calls
        ids = call.choices[0].ids
        text = enc.decode(ids[:-1] if enc.stopped_on_eos(ids) else ids)
        seen = outcomes[episode.index]
        assert seen["tool_runs"] == [] and seen["answer"] == text
        assert episode.reward == seen["reward"] == len(text) / 100
    assert [r.score for r in rows] == [rollout.started[r.episode].reward for r in rows]


def _prompt_and_response(row: Any) -> tuple[list[int], list[int]]:
    """A row split by its loss mask: the prompt ids (no loss) and the response ids (loss on each)."""
    n = sum(row.loss_mask)
    assert row.loss_mask == [0] * (len(row.input_ids) - n) + [1] * n
    return row.input_ids[:-n], row.input_ids[-n:]


def test_network_guard_refuses_and_records(no_network: list[str]) -> None:
    """The guard the other tests run under refuses off-loopback connects and lookups and records them, and lets
    loopback through: a guard that saw nothing would make their 'no network' claim empty."""
    with pytest.raises(OSError, match="test guard"):
        socket.create_connection(("api.openai.com", 443), timeout=1)
    with pytest.raises(OSError, match="test guard"), socket.socket() as sock:
        sock.connect(("8.8.8.8", 53))
    assert socket.getaddrinfo("127.0.0.1", 80)
    assert no_network == ["getaddrinfo api.openai.com", "connect ('8.8.8.8', 53)"]
    no_network.clear()  # seen: not a failure of this test
