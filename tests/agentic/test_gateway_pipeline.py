"""The ``agent_gateway`` mode: its config (strict, agents resolved, task data), the pieces its step composes
(task order, training rows, warm-up rows), and, in the ``slow`` tier, ``roll train``'s path end to end on Ray.

The fast tests drive the real gateway over the tiny-1m policy in process (``LocalSampler``) or a scripted sampler
(a known tool call); the slow one runs the pipeline as ``roll train`` does, on the shared Ray.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from roll.agentic.pipeline.agent_gateway import AgentConfig, AgentGatewayConfig
from roll.agentic.pipeline.agent_gateway.pipeline import (
    conversation_sample,
    gateway_rows,
    load_tasks,
    resolve_agent,
    sample_rows,
    step_tasks,
)
from roll.core.errors import ConfigError

openai = pytest.importorskip("openai", reason="the OpenAI client is the roll-agentic[openai] extra")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agent_gateway_lookup.yaml"
ROWS = [{"question": "q", "secret": str(d)} for d in range(5)]


def echo_agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """A module:function agent for the tests: one chat call, reward 1."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
    return 1.0


def alternating_agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """A module:function agent whose reward alternates by episode (``.../episodes/<i>/v1``), so every GRPO group
    of two episodes has a nonzero advantage: one chat call, reward ``i % 2``."""
    echo_agent(base_url, api_key, task)
    return float(int(base_url.rsplit("/episodes/", 1)[1].split("/")[0]) % 2)


def _config(**over: Any) -> AgentGatewayConfig:
    base: dict[str, Any] = {"agent": {"type": "lookup"}, "tasks": {"rows": ROWS}}
    return AgentGatewayConfig.model_validate({**base, **over})


def test_config_is_strict_and_names_what_is_wrong() -> None:
    """Unknown keys, an unknown plugin, a malformed callable path, options for a callable, both or neither task
    source, an estimator the mode lacks: each refused at load time, naming the key."""
    assert _config().agent.type == "lookup" and _config().rollout.max_new_tokens == 64
    cases = {
        "extra_forbidden": {"agnet": {}},
        "no roll.agent plugin named 'nope'": {"agent": {"type": "nope"}},
        "not package.module:function": {"agent": {"type": "a b:c"}},
        "a module:function agent takes none": {"agent": {"type": "m:f", "options": {"x": 1}}},
        "exactly one of tasks.rows and tasks.path": {"tasks": {"rows": ROWS, "path": "x.jsonl"}},
        "tasks.rows is empty": {"tasks": {"rows": []}},
        "gigpo": {"algorithm": {"adv_estimator": "gigpo"}},
    }
    for message, over in cases.items():
        with pytest.raises(ValueError, match=message):
            _config(**over)
    with pytest.raises(ValueError, match="extra_forbidden"):
        _config(gateway={"prot": 1})


def test_agents_resolve_from_plugins_and_callables() -> None:
    assert resolve_agent(AgentConfig(type=f"{__name__}:echo_agent")) is echo_agent
    assert callable(resolve_agent(AgentConfig(type="lookup", options={"show_tools": False})))
    with pytest.raises(ConfigError, match="cannot import"):
        resolve_agent(AgentConfig(type=f"{__name__}:no_such_agent"))
    with pytest.raises(ConfigError, match="not a callable"):
        resolve_agent(AgentConfig(type=f"{__name__}:ROWS"))


def test_step_tasks_cover_each_pass_once_and_depend_only_on_the_step(tmp_path: Path) -> None:
    """Steps of 2 rows over 5 tasks: every pass of 5 consecutive picks is a permutation; a step's rows are the
    same whenever asked (a resumed run plays what the uninterrupted one would); passes differ in order."""
    picks = [t["secret"] for step in range(10) for t in step_tasks(ROWS, 2, seed=3, step=step)]
    passes = [picks[i : i + 5] for i in range(0, 20, 5)]
    assert all(sorted(p) == ["0", "1", "2", "3", "4"] for p in passes)
    assert len({tuple(p) for p in passes}) > 1
    assert step_tasks(ROWS, 2, seed=3, step=7) == step_tasks(ROWS, 2, seed=3, step=7)
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    cfg = _config(tasks={"path": str(path)})
    assert load_tasks(cfg.tasks) == ROWS
    path.write_text("[1]\n")
    with pytest.raises(ValueError, match="line 1: a row must be a JSON object"):
        load_tasks(cfg.tasks)


@pytest.fixture(scope="module")
def encoder() -> Any:
    from transformers import AutoTokenizer

    from roll.agentic.env_manager.chat import ChatEncoder
    from roll.data.tiny import tiny_model_path

    return ChatEncoder(AutoTokenizer.from_pretrained(tiny_model_path("tiny-1m")))


def test_warmup_conversations_train_the_tokens_the_gateway_renders(encoder: Any) -> None:
    """A warm-up conversation's prompt is the gateway's render of the same request (token for token), its
    answer the format's tool call then the stop token; a conversation not ending with an answer is refused."""
    from roll.agentic.gateway.formats import render_messages
    from roll.agentic.gateway.lookup import CALL_TEXT, TOOL, warmup_conversations

    convs = warmup_conversations(40, random.Random(1), tool_fraction=1.0)
    call = next(c for c in convs if len(c["messages"]) == 3)
    row = conversation_sample(encoder, call)
    prompt = encoder.prompt_ids(render_messages(call["messages"][:2], [TOOL]))
    assert row.input_ids[: len(prompt)] == prompt and sum(row.loss_mask) == len(row.input_ids) - len(prompt)
    assert row.input_ids[len(prompt) :] == [*encoder.encode(CALL_TEXT), encoder.eos_token_id]
    read = next(c for c in convs if len(c["messages"]) == 5)
    answer = encoder.decode([t for t, m in zip(conversation_sample(encoder, read).input_ids,
                                               conversation_sample(encoder, read).loss_mask) if m][:-1])  # fmt: skip
    assert answer == read["messages"][-1]["content"]
    with pytest.raises(ValueError, match="ending with the assistant's answer"):
        conversation_sample(encoder, {"messages": read["messages"][:-1]})


def test_gateway_rows_give_an_episode_one_advantage(encoder: Any) -> None:
    """Episodes of two calls each (the lookup agent on a scripted perfect policy, and on one that guesses):
    rows are the recorded ids, each call a segment, so GRPO (through the agentic pipeline's
    ``trajectory_advantages``) gives every trained token of an episode its episode's advantage: with rewards
    1, 1, 0, 0 in one group, +1/-1 scaled by the group std, the same on both calls of an episode."""
    import torch

    from roll.agentic.env_manager.batching import to_batch
    from roll.agentic.env_manager.manager import Generation
    from roll.agentic.gateway.agents import AgentGateway
    from roll.agentic.gateway.config import GatewayConfig
    from roll.agentic.gateway.lookup import CALL_TEXT, LookupAgentConfig, lookup_agent
    from roll.agentic.pipeline.agentic.trajectories import trajectory_advantages
    from roll.core import columns as C
    from roll.pipelines.algorithms.presets import AlgorithmConfig
    from roll.pipelines.policy.objective import PolicyObjective

    def sampler(prompts: Any, seeds: Any, params: Any) -> list[list[Generation]]:
        out = []
        for prompt, seed in zip(prompts, seeds):
            text = encoder.decode(prompt)
            right = (
                seed % 2 == 0 or "<tool_response>" not in text
            )  # some episodes answer wrong after the call
            answer = text.split("<tool_response>\n")[-1][0] if "<tool_response>" in text else CALL_TEXT
            ids = [*encoder.encode(answer if right else "x"), encoder.eos_token_id]
            out.append([Generation(ids, [-0.1] * len(ids), 0)])
        return out

    agent = lookup_agent(LookupAgentConfig(show_tools=False))
    with AgentGateway(GatewayConfig(), encoder, sampler, agent) as gateway:
        rollout = gateway.rollout([{"question": "q", "secret": "4"}], 8, seed=0)
    rewards = [e.reward for e in rollout.started]
    assert 0 < sum(rewards) < 8 and all(len(e.calls) == 2 for e in rollout.started)
    rows = gateway_rows(rollout)
    assert [r.segment for r in rows] == [0, 1] * 8
    logged = sample_rows(rollout, 8, encoder.tokenizer.decode)  # samples.jsonl shows what each call wrote
    for log, episode in zip(logged, rollout.started):
        first, second = log["response"].split("\n[call 2] ")
        assert first.startswith("[call 1] ") and CALL_TEXT in first and log["calls"] == 2
        answer = "4" if episode.reward else "x"
        assert second == f"{answer}{encoder.tokenizer.decode([encoder.eos_token_id])}"
    batch = to_batch(rows, encoder.pad_token_id)
    mask_BT = batch.tensors[C.RESPONSE_MASK].bool()
    sampled = [t for e in rollout.episodes for c in e.calls for g in c.choices for t in g.ids]
    assert batch.tensors[C.INPUT_IDS][mask_BT].tolist() == sampled
    objective = PolicyObjective(AlgorithmConfig(preset="grpo", kl_mode="none"))
    adv_BT = trajectory_advantages(objective, batch).tensors[C.ADVANTAGES]
    r_E = torch.tensor(rewards)
    expected_E = (r_E - r_E.mean()) / (r_E.std() + 1e-6)
    for b, row in enumerate(rows):
        got = adv_BT[b][mask_BT[b]]
        torch.testing.assert_close(
            got, torch.full_like(got, float(expected_E[row.episode])), atol=1e-4, rtol=0
        )


def test_example_validates_and_its_data_files_load() -> None:
    from roll.core.config.loader import load_config

    cfg = load_config(EXAMPLE, [], model=AgentGatewayConfig)
    assert cfg.agent.type == "lookup" and cfg.warmup is not None
    rows = load_tasks(cfg.tasks.model_copy(update={"path": str(ROOT / str(cfg.tasks.path))}))
    assert len(rows) >= cfg.batch.prompts_per_step and all(set(r) == {"question", "secret"} for r in rows)
    warm = [json.loads(line) for line in (ROOT / cfg.warmup.path).read_text().splitlines()]
    assert any(m.get("tool_calls") for c in warm for m in c["messages"])


def test_example_warmup_file_is_its_generator_output_and_every_reading_copies_the_tool() -> None:
    """``examples/data/lookup_warmup.jsonl`` is, line for line, ``warmup_conversations(256, Random(0),
    tool_fraction=0.5, show_tools=False, reading_fraction=0.9)`` (so it can be regenerated, and a change to the
    generator shows up here), and every conversation that reads a tool result answers with exactly that result."""
    from roll.agentic.gateway.lookup import warmup_conversations

    text = (ROOT / "examples/data/lookup_warmup.jsonl").read_text(encoding="utf-8")
    convs = warmup_conversations(
        256, random.Random(0), tool_fraction=0.5, show_tools=False, reading_fraction=0.9
    )
    assert text == "".join(json.dumps(c) + "\n" for c in convs)
    readings = [c["messages"] for c in convs if any(m["role"] == "tool" for m in c["messages"])]
    assert readings and all(
        m[-2]["role"] == "tool" and m[-1]["content"] == m[-2]["content"] for m in readings
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_roll_train_runs_the_agent_through_the_gateway_and_resumes(ray_local: Any, tmp_path: Path) -> None:
    """The example as ``roll train`` builds it (hybrid placement, a 2-step warm-up, 2 RL steps of 2 rows x 2
    episodes) with a ``module:function`` agent (:func:`alternating_agent`): every step ran the agent through the
    gateway (one call per episode, no agent error), trained (``updates`` 1) and synced (policy version rising); a run resumed from the step-1 checkpoint starts at step 2
    with the weights' version the uninterrupted run had there, without a second warm-up."""
    from roll.agentic.pipeline.agent_gateway import SPEC
    from roll.core.config.loader import load_config
    from roll.core.testing import read_metrics

    common = [
        "max_steps=2", "warmup.steps=2", "warmup.batch_size=8", "batch.prompts_per_step=2",
        "batch.samples_per_prompt=2", "batch.micro_batch_samples=4", "rollout.max_new_tokens=48", "cpu_threads=1",
        f"tasks.path={ROOT / 'examples/data/lookup_tasks.jsonl'}", f"warmup.path={ROOT / 'examples/data/lookup_warmup.jsonl'}",
        f"agent.type={__name__}:alternating_agent", "agent.options={}", "checkpoint.every_n_steps=1", "checkpoint.keep_last=2", "tracking.backends=[jsonl]", "tracking.progress=false",
    ]  # fmt: skip

    def run(extra: list[str]) -> dict[int, dict[str, float]]:
        pipeline = SPEC.build(load_config(EXAMPLE, [*common, *extra], model=AgentGatewayConfig))
        try:
            pipeline.run()
        finally:
            pipeline.shutdown()
        return read_metrics(Path(extra[0].split("=", 1)[1]))

    full = run([f"output_dir={tmp_path / 'full'}"])
    assert sorted(full) == [-2, -1, 1, 2], "the warm-up logs its steps before step 1"
    assert full[1]["time/warmup_s"] > 0 and "time/warmup_s" not in full[2], (
        "the warm-up's time is in step 1's row"
    )
    for step in (1, 2):
        m = full[step]
        assert m["agent/errors"] == 0.0 and m["agent/calls"] == 1.0 and m["agent/episodes_kept"] == 4.0
        assert m["agent/reward"] == 0.5
        assert m["actor/updates"] == 1.0 and m["tokens/trained"] > 0
    assert full[2]["policy_version"] == full[1]["policy_version"] + 1
    checkpoint = tmp_path / "full" / "checkpoints" / "step_000001"
    resumed = run([f"output_dir={tmp_path / 'resumed'}", f"resume={checkpoint}"])
    assert sorted(resumed) == [2] and resumed[2]["policy_version"] == full[2]["policy_version"]
