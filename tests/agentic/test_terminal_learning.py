"""The tiny model learns a terminal task: SFT warm-up on a noisy expert, then GRPO whose every reward comes from
a real terminal episode (a jail per episode, the command run as the sandbox uid, the checker after it).

The task is the generated ``files`` family's ``delete`` kind over three files: the command vocabulary is
``rm a.txt``, ``rm b.txt``, ``rm c.txt``, so a ~1M-parameter model can learn it from scratch in seconds. The
warm-up imitates a noisy expert (the task's solution half the time, a random command otherwise: at best
1/2 + 1/2 * 1/3 = 0.67 correct); GRPO then has to find the rest from the checker's verdicts alone.

A simplified loop on purpose (no Ray, no env workers, plain ``generate`` and a policy-gradient loss): the agentic
pipeline's own learning test is tests/agentic/test_agentic_pipeline.py; this one checks that the terminal env's
reward is a learnable signal, within the ~90 s a slow test may cost.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from roll.agentic.envs.terminal import TerminalConfig, TerminalEnv
from roll.agentic.envs.terminal_tasks import FilesTaskConfig, generate_files_task
from roll.agentic.tools.bash import ShellLimits

FAMILY = FilesTaskConfig(kinds=["delete"], num_files=3, show_contents=False)
CONFIG = TerminalConfig(generated=FAMILY, max_steps=1, limits=ShellLimits(timeout_s=5.0))
EVAL_SEEDS = range(10_000, 10_048)


def _prompt(seed: int) -> str:
    return generate_files_task(FAMILY, seed).instruction + "\n$ "


def _episode(seed: int, command: str) -> float:
    """The reward of one real terminal episode in which the model answered ``command``."""
    env = TerminalEnv(CONFIG)
    try:
        env.reset(seed)
        return env.step(command.strip()).reward
    finally:
        env.close()


def _sample(model: Any, tok: Any, prompts: list[str], torch: Any) -> tuple[list[str], Any, Any]:
    """Sampled commands (temperature 1) and the padded prompt+response ids with the response mask."""
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **enc, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=8,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )  # fmt: skip
    response = out[:, enc["input_ids"].shape[1] :]
    ended = (response == tok.eos_token_id).cumsum(1)
    mask_BT = (ended == 0) | ((ended == 1) & (response == tok.eos_token_id))  # tokens up to the first eos
    texts = tok.batch_decode(response.masked_fill(~mask_BT, tok.pad_token_id), skip_special_tokens=True)
    full_mask = torch.cat([torch.zeros_like(enc["input_ids"], dtype=torch.bool), mask_BT], 1)
    attention = torch.cat([enc["attention_mask"], mask_BT.long()], 1)
    return texts, (out, attention), full_mask


def _logp_sum(model: Any, ids_attention: Any, mask_BT: Any, torch: Any) -> Any:
    ids, attention = ids_attention
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
    logp_BT = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    mask = mask_BT[:, 1:].float()
    return (logp_BT * mask).sum(1) / mask.sum(1).clamp(min=1)


def _warmup(model: Any, tok: Any, rng: random.Random, torch: Any, steps: int = 150) -> None:
    """SFT on the noisy expert's answers: the format, and a head start on the task."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tok.padding_side = "right"
    for _ in range(steps):
        seeds = [rng.randrange(10**6) for _ in range(32)]
        texts, starts = [], []
        for seed in seeds:
            task = generate_files_task(FAMILY, seed)
            answer = task.solution[0] if rng.random() < 0.5 else rng.choice(task.commands or [])
            prompt = _prompt(seed)
            starts.append(len(tok(prompt)["input_ids"]))
            texts.append(prompt + answer + tok.eos_token)
        enc = tok(texts, return_tensors="pt", padding=True)
        labels = enc["input_ids"].clone()
        for row, start in enumerate(starts):
            labels[row, :start] = -100
        labels[enc["attention_mask"] == 0] = -100
        loss = model(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()


def _success(model: Any, tok: Any, torch: Any, pool: ThreadPoolExecutor) -> float:
    seeds = list(EVAL_SEEDS)
    texts, _, _ = _sample(model, tok, [_prompt(s) for s in seeds], torch)
    return sum(pool.map(_episode, seeds, texts)) / len(seeds)


def learn(seed: int, rl_steps: int = 16, groups: int = 8, group_size: int = 4) -> tuple[float, float]:
    """(success before RL, success after RL) on 48 held-out tasks, sampled at temperature 1."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 1M model gains nothing from more, and idle OpenMP threads spin on a busy box
    try:
        return _learn(seed, rl_steps, groups, group_size, torch)
    finally:
        torch.set_num_threads(threads)


def _learn(seed: int, rl_steps: int, groups: int, group_size: int, torch: Any) -> tuple[float, float]:
    from roll.data.tiny import build_tiny_model
    from roll.data.tokenizer import build_tokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok, model = build_tokenizer(), build_tiny_model("tiny-1m", seed=seed)
    _warmup(model, tok, rng, torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with ThreadPoolExecutor(8) as pool:
        before = _success(model, tok, torch, pool)
        for _ in range(rl_steps):
            tasks = [rng.randrange(10**6) for _ in range(groups)]
            seeds = [task for task in tasks for _ in range(group_size)]  # a GRPO group: G episodes of a task
            texts, ids, mask = _sample(model, tok, [_prompt(s) for s in seeds], torch)
            rewards_PG = torch.tensor(list(pool.map(_episode, seeds, texts))).view(groups, group_size)
            advantages_PG = (rewards_PG - rewards_PG.mean(1, keepdim=True)) / (
                rewards_PG.std(1, keepdim=True) + 1e-6
            )
            advantages_B = advantages_PG.flatten()  # GRPO: normalized within each group
            loss = -(advantages_B * _logp_sum(model, ids, mask, torch)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        after = _success(model, tok, torch, pool)
    return before, after


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tiny_model_learns_a_terminal_task_from_the_checkers_verdicts() -> None:
    """Measured over seeds 0-4 (see the report in the commit): before/after on the 48 held-out tasks. The
    asserted rise of 0.15 and floor of 0.8 leave the margins stated there."""
    before, after = learn(seed=0)
    assert after > before + 0.15, (before, after)
    assert after > 0.8, (before, after)
