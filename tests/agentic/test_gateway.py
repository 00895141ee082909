"""The agent gateway driven by the real ``openai`` client: routes, tool calls, ``n``, streaming, the API key,
deadlines and limits, agent failures as env errors, and training rows equal to what was sampled.

Two policies: the tiny-1m model in process (``LocalSampler`` on ``HFInferStrategy``: what the gateway serves in
a CPU run), and, where a test needs a known answer (a tool call), a scripted sampler that returns fixed token
ids; the HTTP server, the client, the parser and the recorder are the real ones either way.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

import pytest

from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.manager import Generation
from roll.agentic.gateway.agents import AgentGateway, load_agent
from roll.agentic.gateway.config import GatewayConfig, GatewaySamplingConfig
from roll.agentic.gateway.formats import parse_tool_calls_for, render_messages
from roll.agentic.gateway.lookup import CALL_TEXT, LookupAgentConfig, lookup_agent
from roll.agentic.gateway.record import EpisodeLog
from roll.agentic.gateway.sampler import LocalSampler
from roll.agentic.gateway.server import ApiError
from roll.core.errors import PluginError
from roll.core.failures import FailureGuard
from roll.workers.config import SamplingParams

# the roll-agentic[openai] extra (in the dev group): the per-package check installs roll-agentic without it
openai = pytest.importorskip("openai", reason="the OpenAI client is the roll-agentic[openai] extra")

TASK = {"question": "What is the secret digit?", "secret": "7"}


@pytest.fixture(scope="module")
def tiny() -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll.data.tiny import tiny_model_path

    path = tiny_model_path("tiny-1m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    return {"tokenizer": tokenizer, "model": AutoModelForCausalLM.from_pretrained(path),
            "encoder": ChatEncoder(tokenizer)}  # fmt: skip


class Scripted:
    """A sampler that answers with a tool call until the prompt holds a tool result, then with that result
    (the lookup task played perfectly); ``seen`` keeps every prompt and seed it got."""

    def __init__(self, encoder: ChatEncoder) -> None:
        self.encoder, self.seen = encoder, []

    def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams
    ) -> list[list[Generation]]:
        out = []
        for prompt, seed in zip(prompts, seeds):
            self.seen.append((list(prompt), seed))
            text = self.encoder.decode(prompt)
            answer = text.split("<tool_response>\n")[-1][0] if "<tool_response>" in text else CALL_TEXT
            ids = [*self.encoder.encode(answer), self.encoder.eos_token_id]
            out.append([Generation(ids, [-0.5] * len(ids), 3)] * params.n)
        return out


def test_openai_agent_with_tool_calls_is_recorded_token_in_token_out(tiny: dict[str, Any]) -> None:
    """The lookup agent (OpenAI SDK, ``tools=[...]``) calls the tool, reads it and answers: reward 1. The first
    prompt shows the tool schema in <tools>, the second the <tool_response>; the rows are prompt + sampled ids."""
    enc = tiny["encoder"]
    scripted = Scripted(enc)
    with AgentGateway(GatewayConfig(), enc, scripted, lookup_agent(LookupAgentConfig())) as gateway:
        rollout = gateway.rollout([TASK], 2, seed=5)
    assert not rollout.errors and [e.reward for e in rollout.started] == [1.0, 1.0]
    episode = rollout.episodes[0]
    assert [c.endpoint for c in episode.calls] == ["chat", "chat"]
    first, second = (enc.decode(c.prompt_ids) for c in episode.calls)
    assert '<tools>\n{"type": "function", "function": {"name": "lookup"' in first
    assert "<tool_response>\n7\n</tool_response>" in second and CALL_TEXT.split("\n")[0] in second
    rows = [s for s in rollout.samples() if s.episode == 0]
    assert len(rows) == 2
    for row, call in zip(rows, episode.calls):
        sampled = call.choices[0].ids
        assert row.input_ids == call.prompt_ids + sampled
        assert [t for t, m in zip(row.input_ids, row.loss_mask) if m] == sampled
        assert row.policy_version == 3 and row.score == 1.0
    seeds = [seed for _, seed in scripted.seen]
    assert len(set(seeds)) == 4, "every call of every episode has its own sampling seed"


def test_tiny_policy_via_openai_client_trains_on_the_sampled_ids(tiny: dict[str, Any]) -> None:
    """The tiny policy answers chat (``n=2``, streamed, ``max_tokens``) and completions calls; the rows built from
    the records hold exactly the sampled ids where the loss is, their recorded log-probs are the model's own
    (recomputed: equal to 1e-4), and one policy-gradient step on them changes the weights."""
    import torch

    from roll.agentic.env_manager.batching import to_batch
    from roll.core import columns as C
    from roll.workers.hf_infer import HFInferStrategy

    model, enc = tiny["model"], tiny["encoder"]
    streamed: list[Any] = []

    def agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        assert [m.id for m in client.models.list()] == ["policy"]
        msgs = [{"role": "user", "content": task["question"]}]
        reply = client.chat.completions.create(model="policy", messages=msgs, n=2, max_tokens=6)  # type: ignore[arg-type]
        assert len(reply.choices) == 2 and reply.usage is not None and reply.usage.completion_tokens <= 12
        chunks = client.chat.completions.create(model="policy", messages=msgs, stream=True)  # type: ignore[arg-type]
        streamed.append("".join(c.choices[0].delta.content or "" for c in chunks))
        text = client.completions.create(model="policy", prompt="1 + 2 =", max_tokens=4).choices[0].text
        return float(len(text) > 0)

    strategy = HFInferStrategy(model, tokenizer=tiny["tokenizer"])
    with AgentGateway(
        GatewayConfig(), enc, LocalSampler(strategy), agent, sampling=GatewaySamplingConfig(max_new_tokens=8)
    ) as gateway:
        rollout = gateway.rollout([TASK, TASK], 2, seed=1)
    assert not rollout.errors, rollout.errors[0].traceback
    episode = rollout.episodes[0]
    assert [c.endpoint for c in episode.calls] == ["chat", "chat", "completions"]
    assert [len(c.choices) for c in episode.calls] == [2, 1, 1]
    assert streamed[0] or episode.calls[1].choices[0].ids == [enc.eos_token_id]
    samples = rollout.samples()
    assert len(samples) == 4 * 4  # 4 episodes x (2 + 1 + 1 choices)
    batch = to_batch(samples, enc.pad_token_id)
    mask_BT = batch.tensors[C.RESPONSE_MASK].bool()
    sampled = [t for e in rollout.episodes for c in e.calls for g in c.choices for t in g.ids]
    assert batch.tensors[C.INPUT_IDS][mask_BT].tolist() == sampled
    ids_BT = batch.tensors[C.INPUT_IDS]
    model.train()
    logits = model(input_ids=ids_BT, attention_mask=batch.tensors[C.ATTENTION_MASK]).logits
    logp_BT = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids_BT[:, 1:, None]).squeeze(-1)
    recorded = batch.tensors[C.INFER_LOGP][:, 1:][mask_BT[:, 1:]]
    torch.testing.assert_close(logp_BT[mask_BT[:, 1:]].detach(), recorded, atol=1e-4, rtol=0)
    before = [p.detach().clone() for p in model.parameters()]
    adv_B = torch.linspace(-1, 1, len(samples))
    loss = -(adv_B[:, None] * logp_BT * mask_BT[:, 1:]).sum() / mask_BT.sum()
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    model.zero_grad()
    model.eval()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _http(url: str, key: str | None, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None)
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_key_routes_and_limits_are_enforced(tiny: dict[str, Any]) -> None:
    """As an attacker would try: no key, a wrong key, the previous rollout's key, another rollout's episode, a
    bad body, n and max_tokens over the limits, one call too many: each refused with its status and code."""
    enc = tiny["encoder"]
    seen: dict[str, Any] = {}

    def agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
        seen.update(url=base_url, key=api_key)
        root = base_url.rsplit("/episodes/", 1)[0]
        chat = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        seen["no_key"] = _http(f"{base_url}/models", None)[0]
        seen["wrong_key"] = _http(f"{base_url}/models", api_key + "x")[0]
        seen["other_episode"] = _http(f"{root}/episodes/99/v1/models", api_key)
        seen["bad_json"] = _http(f"{base_url}/chat/completions", api_key, {"messages": "hi"})
        seen["big_n"] = _http(f"{base_url}/chat/completions", api_key, {**chat, "n": 9})
        seen["long"] = _http(f"{base_url}/chat/completions", api_key,
                             {**chat, "messages": [{"role": "user", "content": "x " * 3000}]})  # fmt: skip
        seen["ok"] = _http(f"{base_url}/chat/completions", api_key, chat)[0]
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        with pytest.raises(openai.PermissionDeniedError) as refused:
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "again"}])
        seen["limit"] = refused.value.code
        return 0.0

    config = GatewayConfig(max_calls_per_episode=1, max_context_tokens=512)
    sampling = GatewaySamplingConfig(max_new_tokens=4)
    with AgentGateway(config, enc, Scripted(enc), agent, sampling=sampling) as gateway:
        rollout = gateway.rollout([TASK], 1, seed=0)
        stale = _http(f"{seen['url']}/models", seen["key"])  # the rollout is over: its key is void
    assert not rollout.errors, rollout.errors[0].traceback
    assert seen["no_key"] == 401 and seen["wrong_key"] == 401 and stale[0] == 401
    assert seen["other_episode"][0] == 404 and seen["other_episode"][1]["error"]["code"] == "unknown_episode"
    assert seen["bad_json"][0] == 400 and seen["big_n"][1]["error"]["code"] == "invalid_n"
    assert seen["long"][1]["error"]["code"] == "context_length_exceeded"
    assert seen["ok"] == 200 and seen["limit"] == "call_limit"
    assert rollout.started[0].refused == 1 and len(rollout.started[0].calls) == 1


def test_crashing_agent_is_an_env_error_shown_once(tiny: dict[str, Any], caplog: Any) -> None:
    """An agent that raises ends its episode as an error: a report per episode with the user's traceback, the
    ``agent/errors`` rate 1, no training rows; the driver's guard shows the traceback once for all four."""
    enc = tiny["encoder"]

    def agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
        openai.OpenAI(base_url=base_url, api_key=api_key).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}]
        )
        raise KeyError("the agent's own bug")

    with AgentGateway(GatewayConfig(), enc, Scripted(enc), agent, name="buggy") as gateway:
        rollout = gateway.rollout([TASK, TASK], 2, seed=0)
    assert rollout.samples() == [] and rollout.metrics()["agent/errors"] == 1.0
    assert len(rollout.errors) == 4 and {r.kind for r in rollout.errors} == {"KeyError"}
    assert "the agent's own bug" in (rollout.errors[0].traceback or "")
    assert "after 1 call(s)" in rollout.errors[0].message and rollout.errors[0].source == "agent buggy"
    guard = FailureGuard()
    assert guard.show(rollout.errors) == 1 and guard.counts[("agent buggy", "KeyError")] == 4


def test_deadline_cuts_off_the_agent_and_refuses_its_calls(tiny: dict[str, Any]) -> None:
    """An agent that outlives ``episode_timeout_s`` is a timeout (dropped, counted); a call past an episode's
    deadline is refused with 403 ``episode_deadline``; a reward that is not a finite number is an error."""
    enc = tiny["encoder"]

    released = threading.Event()

    def slow(base_url: str, api_key: str, task: dict[str, Any]) -> float:
        released.wait(60)  # far past the deadline; released at the end so no thread outlives the test
        return 1.0

    with AgentGateway(GatewayConfig(episode_timeout_s=0.5), enc, Scripted(enc), slow) as gateway:
        start = time.monotonic()
        rollout = gateway.rollout([TASK], 2, seed=0)
        assert time.monotonic() - start < 30, "the rollout waited for an agent past its deadline"
        released.set()
        past = EpisodeLog(0, 0, {}, deadline=time.monotonic() - 1)
        gateway.server.open_rollout([past], "k", 0)
        with pytest.raises(ApiError) as refused:
            gateway.server.handle("POST", "/episodes/0/v1/chat/completions", {"authorization": "Bearer k"},
                                  b'{"messages": [{"role": "user", "content": "late"}]}')  # fmt: skip
    assert refused.value.status == 403 and refused.value.code == "episode_deadline" and past.refused == 1
    assert [e.status for e in rollout.started] == ["timeout", "timeout"]
    assert rollout.metrics()["agent/timeouts"] == 2.0 and rollout.errors[0].kind == "timeout"

    with AgentGateway(GatewayConfig(), enc, Scripted(enc), lambda u, k, t: math.nan) as gateway:
        bad = gateway.rollout([TASK], 1, seed=0)
    assert bad.errors[0].kind == "ValueError" and "nan" in bad.errors[0].message


def test_tool_call_format_renders_and_parses_hermes() -> None:
    """Calls come back as OpenAI tool_calls (arguments a JSON string) with the text around them as content; a
    malformed call stays text; assistant tool calls and tool results render as Hermes text, results of one turn
    in one user message."""
    text = 'let me look<tool_call>{"name": "lookup", "arguments": {"key": "b"}}</tool_call>'
    parsed = parse_tool_calls_for(text)
    assert parsed.content == "let me look" and len(parsed.tool_calls) == 1
    assert parsed.tool_calls[0]["function"] == {"name": "lookup", "arguments": '{"key": "b"}'}
    broken = parse_tool_calls_for('<tool_call>{"name": lookup}</tool_call>')
    assert broken.tool_calls == [] and broken.content == '<tool_call>{"name": lookup}</tool_call>'
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    plain = render_messages(
        [{"role": "user", "content": [{"type": "text", "text": "q"}]},
         {"role": "assistant", "content": None, "tool_calls": [call, call]},
         {"role": "tool", "tool_call_id": "1", "content": "r1"}, {"role": "tool", "tool_call_id": "1", "content": "r2"}],
        tools=[{"type": "function", "function": {"name": "f"}}],
    )  # fmt: skip
    assert [m["role"] for m in plain] == ["system", "user", "assistant", "user"]
    assert plain[0]["content"].startswith("# Tools") and '{"name": "f"}' in plain[0]["content"]
    assert plain[2]["content"].count('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>') == 2
    assert (
        plain[3]["content"] == "<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>"
    )


def test_agents_load_from_the_roll_agent_group() -> None:
    assert callable(load_agent("lookup", {"show_tools": False}))
    with pytest.raises(PluginError, match="lookup"):
        load_agent("no_such_agent")
    sampler = LocalSampler  # the in-process sampler is what tests and notebooks use
    assert sampler.__name__ == "LocalSampler"


def test_docs_gateway_sections_validate() -> None:
    """docs/agent_gateway.md's YAML: the section listing every key is exactly the defaults, and the GPU
    fragment's ``gateway`` and ``actor_infer`` validate against their models (test_docs only parses fragments)."""
    import re
    from pathlib import Path

    import yaml

    from roll.workers.roles.config import InferRoleConfig

    text = (Path(__file__).resolve().parents[2] / "docs" / "agent_gateway.md").read_text(encoding="utf-8")
    blocks = [yaml.safe_load(b) for b in re.findall(r"^```yaml\n(.*?)^```", text, flags=re.S | re.M)]
    every, gpu = (b for b in blocks if "gateway" in b)
    assert set(every["gateway"]) == set(GatewayConfig.model_fields)
    assert GatewayConfig.model_validate(every["gateway"]) == GatewayConfig()
    assert GatewaySamplingConfig.model_validate(every["rollout"]) == GatewaySamplingConfig()
    GatewaySamplingConfig.model_validate(gpu["rollout"])
    GatewayConfig.model_validate(gpu["gateway"])
    assert InferRoleConfig.model_validate(gpu["actor_infer"]).strategy.type == "vllm"


def test_cluster_sampler_matches_local_sampler(tiny: dict[str, Any]) -> None:
    """``ClusterSampler`` speaks the inference role's ``generate`` columns (prompt ids, a seed tensor per prompt;
    back: prompt index, response ids and log-probs, policy version): run through the role's own helpers on one
    rank, it gives what ``LocalSampler`` gives for the same seeds, ``n`` choices per prompt in prompt order."""
    from roll.agentic.gateway.sampler import ClusterSampler
    from roll.workers.hf_infer import HFInferStrategy
    from roll.workers.roles import infer as role

    strategy = HFInferStrategy(tiny["model"], tokenizer=tiny["tokenizer"])

    class OneRank:  # ActorInferWorker.generate's body, without Ray
        def generate(self, batch: Any, params: SamplingParams) -> Any:
            ids, index = role._prompt_ids(batch), role._prompt_index(batch, 0)
            samples = strategy.generate(ids, params, role._prompt_seeds(batch, index, params))
            return role._samples_batch(samples, batch, ids, index, params.n)

    prompts, seeds = [[5, 6, 7], [8, 9]], [2**62 + 3, 11]
    params = SamplingParams(n=2, max_new_tokens=5)
    remote, local = (
        ClusterSampler(OneRank())(prompts, seeds, params),
        LocalSampler(strategy)(prompts, seeds, params),
    )
    assert [[g.ids for g in p] for p in remote] == [[g.ids for g in p] for p in local]
    assert [len(p) for p in remote] == [2, 2] and remote[0][0].ids != remote[1][0].ids
    assert [[g.logp for g in p] for p in remote] == [[g.logp for g in p] for p in local]
