"""Learning through the agent gateway: an OpenAI-SDK agent that must call a tool to answer gets better with RL
on nothing but what the gateway recorded.

The task (:mod:`roll.agentic.gateway.lookup`): a secret digit per task row, reachable only through the ``lookup``
tool; a guess is right 1 time in 10. A warm-up SFT (as the agentic pipeline's) teaches the tiny-1m policy the
format (a ``<tool_call>`` or a bare digit) and to copy a tool result, calling the tool in only
``TOOL_FRACTION`` of first answers. Then REINFORCE with GRPO advantages (``grpo_advantages`` over the episodes of
each task row), trained in process on the gateway's rows (``AgentRollout.samples``: recorded prompt ids + sampled
ids, loss on the sampled ones); the policy serves the agents through ``LocalSampler`` on the same module, so
every step is on-policy. The success rate before RL (step 1's rollout) and after (the mean of the last two
steps' rollouts) is measured for each seed of ``SEEDS``.

Simplifications, on purpose: an in-process trainer (the Ray pipeline's trainer is tested elsewhere) and the
agent sends no tool schema (``show_tools: false``: the schema would make every prompt ~10x longer for a policy
that learned the tool in its warm-up; tests/agentic/test_gateway.py covers the schema's rendering).
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

SEEDS = (0, 1, 2)
TOOL_FRACTION = 0.3
RL_STEPS = 6
TASKS_PER_STEP, GROUP_SIZE = 4, 4
WARMUP_STEPS, WARMUP_ROWS = 40, 16
MARGIN = 0.2
RL_LR = 2e-3


def run_seed(seed: int) -> tuple[float, float, list[float]]:
    """``(success before RL, success after, every step's)`` for one seed (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll.agentic.env_manager.chat import ChatEncoder
    from roll.agentic.gateway.agents import AgentGateway
    from roll.agentic.gateway.config import GatewayConfig
    from roll.agentic.gateway.lookup import LookupAgentConfig, lookup_agent, lookup_tasks
    from roll.agentic.gateway.sampler import LocalSampler
    from roll.data.tiny import tiny_model_path
    from roll.workers.hf_infer import HFInferStrategy

    torch.manual_seed(seed)
    torch.set_num_threads(1)  # one thread: under CI's load, two contend and run ~3x slower
    path = tiny_model_path("tiny-1m")
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    encoder = ChatEncoder(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    t0 = time.monotonic()
    _warmup(model, encoder, optimizer, random.Random(seed))
    print(f"  warm-up {time.monotonic() - t0:.1f} s", flush=True)
    for group in optimizer.param_groups:
        group["lr"] = RL_LR
    strategy = HFInferStrategy(model, tokenizer=tokenizer)
    agent = lookup_agent(LookupAgentConfig(show_tools=False))
    config = GatewayConfig(max_new_tokens=40, episode_timeout_s=120, batch_wait_s=0.05)
    success = []
    with AgentGateway(config, encoder, LocalSampler(strategy), agent, name="lookup") as gateway:
        for step in range(RL_STEPS):
            t0 = time.monotonic()
            tasks = lookup_tasks(TASKS_PER_STEP, seed * 1000 + step)
            rollout = gateway.rollout(tasks, GROUP_SIZE, seed=seed * 1000 + step)
            assert not rollout.errors, rollout.errors[0].traceback
            success.append(rollout.metrics()["agent/success_rate"])
            _reinforce(model, optimizer, rollout, encoder.pad_token_id)
            strategy.load_weights({}, step + 1)
            print(f"  step {step}: success {success[-1]:.3f} ({time.monotonic() - t0:.1f} s)", flush=True)
    return success[0], sum(success[-2:]) / 2, success


def _warmup(model: Any, encoder: Any, optimizer: Any, rng: random.Random, steps: int = WARMUP_STEPS) -> None:
    import torch

    from roll.agentic.env_manager.batching import to_batch
    from roll.agentic.env_manager.episode import Sample
    from roll.agentic.gateway.lookup import warmup_rows

    model.train()
    for _ in range(steps):
        rows = warmup_rows(WARMUP_ROWS, rng, tool_fraction=TOOL_FRACTION, show_tools=False)
        samples = []
        for messages, answer in rows:
            prompt, response = encoder.prompt_ids(messages), [*encoder.encode(answer), encoder.eos_token_id]
            samples.append(Sample(prompt + response, [0] * len(prompt) + [1] * len(response),
                                  [0.0] * (len(prompt) + len(response)), 0.0, 0, 0, "warmup", False))  # fmt: skip
        batch = to_batch(samples, encoder.pad_token_id)
        logp_BT, mask_BT = _token_logp(model, batch)
        loss = -(logp_BT * mask_BT).sum() / mask_BT.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    del torch


def _token_logp(model: Any, batch: Any) -> tuple[Any, Any]:
    """``logp_BT`` of each token given the ones before it (position 0: 0), and the float loss mask."""
    import torch

    from roll.core import columns as C

    ids_BT, attn_BT = batch.tensors[C.INPUT_IDS], batch.tensors[C.ATTENTION_MASK]
    logits = model(input_ids=ids_BT, attention_mask=attn_BT).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids_BT[:, 1:, None]).squeeze(-1)
    logp_BT = torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1)
    return logp_BT, batch.tensors[C.RESPONSE_MASK].float()


def _reinforce(model: Any, optimizer: Any, rollout: Any, pad_id: int) -> None:
    """One policy-gradient step on the recorded rows: GRPO advantages per episode, token-mean loss."""
    import torch

    from roll.agentic.env_manager.batching import to_batch
    from roll.pipelines.algorithms.advantages import grpo_advantages

    rewards_PG = torch.tensor([e.reward for e in rollout.started]).view(-1, GROUP_SIZE)
    adv_E = grpo_advantages(rewards_PG).flatten()
    samples = rollout.samples()
    if not samples or not adv_E.abs().sum():
        return
    batch = to_batch(samples, pad_id)
    adv_B = adv_E[torch.tensor([s.episode for s in samples])]
    model.train()
    logp_BT, mask_BT = _token_logp(model, batch)
    loss = -(adv_B[:, None] * logp_BT * mask_BT).sum() / mask_BT.sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    model.eval()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rl_through_the_gateway_learns_to_call_the_tool() -> None:
    """Every seed's success rises by more than ``MARGIN`` (figures in the report; measured: see below)."""
    start, results = time.monotonic(), {seed: run_seed(seed) for seed in SEEDS}
    for seed, (before, after, series) in results.items():
        print(f"seed {seed}: before {before:.3f} after {after:.3f} series {[round(s, 3) for s in series]}")
    print(f"{len(SEEDS)} seeds in {time.monotonic() - start:.0f} s")
    for seed, (before, after, series) in results.items():
        assert after > before + MARGIN, f"seed {seed}: success {series} did not rise by {MARGIN}"


if __name__ == "__main__":
    for s in SEEDS:
        t = time.monotonic()
        print(s, run_seed(s), f"{time.monotonic() - t:.1f}s", flush=True)
