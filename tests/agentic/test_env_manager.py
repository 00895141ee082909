"""Env managers without Ray: token-exact multi-turn samples, step-wise windows and anchors, parsing, redundancy.

The policy is scripted (a GenerateFn that answers fixed texts) and the envs run in-process (EnvSlots), so every
token position can be predicted by hand from the ChatML template of the offline tokenizer.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from roll.agentic.env_manager.batching import to_batch
from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.config import EnvEntryConfig, EnvManagerConfig
from roll.agentic.env_manager.episode import anchor_id
from roll.agentic.env_manager.manager import Generation, RolloutManager, group_plan
from roll.agentic.env_manager.slots import EnvSlots, ResetRequest, StepRequest, build_env, valid_actions_of
from roll.agentic.types import StepResult
from roll.core import columns as C

SYSTEM = "Go. Valid actions: Left, Up"


class TwoTurnEnv:
    """Hand-made: observation 'obs one', then 'obs two'; rewards 0.25 then 1.0; ends after two steps."""

    max_steps = 2

    def __init__(self) -> None:
        self.t = 0

    @property
    def system_prompt(self) -> str:
        return SYSTEM

    @property
    def action_space_text(self) -> str:
        return "Valid actions: Left, Up"

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.t = 0
        return "obs one", {"seed": seed}

    def step(self, action: str) -> StepResult:
        self.t += 1
        done = self.t >= 2
        info = {"success": done and action == "Up"}
        return StepResult("obs two", 0.25 if self.t == 1 else 1.0, done, False, info)

    def render(self, mode: str = "text") -> str:
        return f"t={self.t}"

    def close(self) -> None:
        return None


@pytest.fixture(scope="module")
def encoder() -> ChatEncoder:
    from roll.data.tokenizer import build_tokenizer

    return ChatEncoder(build_tokenizer("roll-tiny"))


class Scripted:
    """Answers the k-th call with ``answers[k]`` for every prompt, log-prob -0.5 per token; records prompts."""

    def __init__(self, encoder: ChatEncoder, answers: list[str], eos: bool = True) -> None:
        self.encoder, self.answers, self.eos = encoder, iter(answers), eos
        self.prompts: list[list[list[int]]] = []

    def __call__(self, prompts: list[list[int]], *, seed: int) -> list[Generation]:
        self.prompts.append(prompts)
        ids = self.encoder.encode(next(self.answers)) + ([self.encoder.eos_token_id] if self.eos else [])
        return [Generation(list(ids), [-0.5] * len(ids)) for _ in prompts]


def _manager(
    encoder: ChatEncoder, answers: list[str], slots: int = 1, max_new_tokens: int = 32, **overrides: Any
) -> RolloutManager:
    config = EnvManagerConfig(envs=[EnvEntryConfig(type="two_turn")], **overrides)
    pool = EnvSlots(slots, lambda entry: TwoTurnEnv(), timeout_s=5.0)
    return RolloutManager(config, pool, Scripted(encoder, answers), encoder, max_new_tokens=max_new_tokens)


def _segments(encoder: ChatEncoder, parts: list[tuple[str, int]]) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    mask: list[int] = []
    for text, trained in parts:
        piece = encoder.encode(text)
        ids += piece
        mask += [trained] * len(piece)
    return ids, mask


def test_trajectory_sample_masks_token_by_token(encoder: ChatEncoder) -> None:
    """Trained positions are exactly the model's two answers (each with its <|im_end|>); the system prompt,
    both observations and the template's role markers and newlines are masked; the return 0.25 + 1.0 sits on
    the last answer token only."""
    rollout = _manager(encoder, ["<answer>Left</answer>", "<answer>Up</answer>"]).rollout(1, 1, batch_seed=0)
    [sample] = rollout.samples("trajectory")
    want_ids, want_mask = _segments(
        encoder,
        [
            (
                f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nobs one<|im_end|>\n<|im_start|>assistant\n",
                0,
            ),
            ("<answer>Left</answer><|im_end|>", 1),
            ("\n<|im_start|>user\nobs two<|im_end|>\n<|im_start|>assistant\n", 0),
            ("<answer>Up</answer><|im_end|>", 1),
        ],
    )
    assert sample.input_ids == want_ids
    assert sample.loss_mask == want_mask
    # The same ids as the tokenizer's own template applied to the whole conversation.
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "obs one"},
        {"role": "assistant", "content": "<answer>Left</answer>"},
        {"role": "user", "content": "obs two"},
        {"role": "assistant", "content": "<answer>Up</answer>"},
    ]
    full = encoder.tokenizer.apply_chat_template(messages, tokenize=False).removesuffix("\n")
    assert encoder.encode(full) == want_ids

    batch = to_batch([sample], encoder.pad_token_id)
    trained = [t for t, m in enumerate(want_mask) if m]
    assert batch.tensors[C.RESPONSE_MASK][0].tolist() == want_mask
    rewards_T = batch.tensors[C.TOKEN_REWARDS][0]
    assert rewards_T.nonzero().flatten().tolist() == [trained[-1]]
    assert rewards_T[trained[-1]].item() == pytest.approx(1.25)
    logp_T = batch.tensors[C.INFER_LOGP][0]
    assert (
        logp_T[trained].eq(-0.5).all() and logp_T[[t for t, m in enumerate(want_mask) if not m]].eq(0).all()
    )
    assert rollout.episodes[0].success


def test_turn_cut_by_token_limit_closes_with_template_markup(encoder: ChatEncoder) -> None:
    """An answer without <|im_end|> (stopped at max_new_tokens): the whole closing <|im_end|> is markup."""
    config = EnvManagerConfig(envs=[EnvEntryConfig(type="two_turn")])
    pool = EnvSlots(1, lambda entry: TwoTurnEnv(), timeout_s=5.0)
    manager = RolloutManager(
        config, pool, Scripted(encoder, ["Left", "Up"], eos=False), encoder, max_new_tokens=32
    )
    [sample] = manager.rollout(1, 1, batch_seed=0).samples("trajectory")
    _, want_mask = _segments(
        encoder,
        [
            (
                f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nobs one<|im_end|>\n<|im_start|>assistant\n",
                0,
            ),
            ("Left", 1),
            ("<|im_end|>\n<|im_start|>user\nobs two<|im_end|>\n<|im_start|>assistant\n", 0),
            ("Up", 1),
        ],
    )
    assert sample.loss_mask == want_mask


def test_step_samples_window_returns_and_anchors(encoder: ChatEncoder) -> None:
    manager = _manager(
        encoder,
        ["<answer>Left</answer>", "<answer>Up</answer>"],
        slots=2,
        mode="step",
        history_window=1,
        gamma=0.5,
    )
    rollout = manager.rollout(1, 2, batch_seed=0)
    samples = rollout.samples("step", gamma=0.5)
    assert len(samples) == 4  # 2 envs x 2 turns
    first, second = samples[0], samples[1]
    prompt2 = encoder.prompt_ids(
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "obs one"},
            {"role": "assistant", "content": "<answer>Left</answer>"},
            {"role": "user", "content": "obs two"},
        ]
    )
    answer = [*encoder.encode("<answer>Up</answer>"), encoder.eos_token_id]
    assert second.input_ids == prompt2 + answer
    assert second.loss_mask == [0] * len(prompt2) + [1] * len(answer)
    assert first.step_return == pytest.approx(0.25 + 0.5 * 1.0) and second.step_return == pytest.approx(1.0)
    # Both envs of the group visit "obs one" and "obs two": two anchor groups of two steps each.
    assert first.anchor == samples[2].anchor == anchor_id(0, "obs one")
    assert second.anchor == samples[3].anchor != first.anchor
    batch = to_batch(samples, encoder.pad_token_id)
    assert torch.unique(batch.tensors[C.ANCHOR_ID]).numel() == 2
    assert batch.tensors[C.STEP_RETURN].tolist() == pytest.approx([0.75, 1.0, 0.75, 1.0])


def test_format_penalty_and_parsing(encoder: ChatEncoder) -> None:
    """An answer outside the tags is still parsed (last valid word) but costs the format penalty."""
    manager = _manager(encoder, ["I go Left", "<answer>Up</answer>"], format_penalty=-0.2)
    episode = manager.rollout(1, 1, batch_seed=0).episodes[0]
    assert [t.action for t in episode.turns] == ["Left", "Up"]
    assert [t.format_ok for t in episode.turns] == [False, True]
    assert [t.reward for t in episode.turns] == pytest.approx([0.25 - 0.2, 1.0])


def test_context_limit_truncates_and_keeps_the_episode(encoder: ChatEncoder) -> None:
    manager = _manager(
        encoder, ["<answer>Left</answer>", "<answer>Up</answer>"], max_context_tokens=60, max_new_tokens=16
    )
    episode = manager.rollout(1, 1, batch_seed=0).episodes[0]
    assert episode.status == "context_limit" and len(episode.turns) == 1 and episode.kept


def test_group_plan_shares_seeds_within_groups() -> None:
    config = EnvManagerConfig(envs=[EnvEntryConfig(type="a"), EnvEntryConfig(type="b", weight=2)])
    plan = group_plan(config, num_groups=3, group_size=2, batch_seed=7)
    assert [entry for entry, _ in plan] == [0, 0, 1, 1, 1, 1]
    seeds = [seed for _, seed in plan]
    assert seeds[0] == seeds[1] and seeds[2] == seeds[3] and len(set(seeds)) == 3
    assert plan == group_plan(config, 3, 2, batch_seed=7)


class SlowEnv(TwoTurnEnv):
    """Takes ``delay`` seconds per step."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def step(self, action: str) -> StepResult:
        import time

        time.sleep(self.delay)
        return super().step(action)


def test_redundancy_keeps_the_first_groups_to_finish(encoder: ChatEncoder) -> None:
    """Three groups are started for two: the group whose env hangs is the one left out."""
    delays = iter([0.0, 0.0, 30.0, 0.0, 0.0, 0.0])
    config = EnvManagerConfig(envs=[EnvEntryConfig(type="two_turn")], extra_groups=1, step_timeout_s=1.0)
    pool = EnvSlots(6, lambda entry: SlowEnv(next(delays)), timeout_s=1.0)
    manager = RolloutManager(
        config,
        pool,
        Scripted(encoder, ["<answer>Left</answer>", "<answer>Up</answer>"]),
        encoder,
        max_new_tokens=32,
    )
    rollout = manager.rollout(2, 2, batch_seed=0)
    assert sorted({e.group for e in rollout.episodes}) == [0, 2]
    assert len(rollout.episodes) == 4
    assert rollout.metrics()["env/timeouts"] == 1.0


def test_slots_validate_and_read_valid_actions() -> None:
    env = build_env(EnvEntryConfig(type="frozen_lake", options={"size": 3}))
    assert valid_actions_of(env) == ("Left", "Down", "Right", "Up")
    countdown = build_env(EnvEntryConfig(type="countdown"))
    assert valid_actions_of(countdown) is None
    slots = EnvSlots(2, lambda entry: build_env(EnvEntryConfig(type="guess_direction")), timeout_s=5)
    out = slots.reset([ResetRequest(0, 3), None])
    assert out[1] is None and out[0] is not None and out[0].error is None
    assert slots.step([None, StepRequest("Left")])[1].error is not None  # type: ignore[union-attr]


class Versioned(Scripted):
    """:class:`Scripted`, but the k-th call reports policy version ``7 + k`` (weights updated between turns)."""

    def __call__(self, prompts: list[list[int]], *, seed: int) -> list[Generation]:
        version = 7 + len(self.prompts)
        return [Generation(g.ids, g.logp, version) for g in super().__call__(prompts, seed=seed)]


def test_samples_record_the_policy_version_that_sampled_them(encoder: ChatEncoder) -> None:
    """Turn 1 is sampled by version 7, turn 2 by 8: step rows carry their turn's version, the trajectory row the
    oldest (7: the bound on its staleness), and the batch column ``policy_version_B`` holds them."""
    config = EnvManagerConfig(envs=[EnvEntryConfig(type="two_turn")])
    pool = EnvSlots(1, lambda entry: TwoTurnEnv(), timeout_s=5.0)
    answers = ["<answer>Left</answer>", "<answer>Up</answer>"]
    rollout = RolloutManager(config, pool, Versioned(encoder, answers), encoder, max_new_tokens=32).rollout(
        1, 1, batch_seed=0
    )
    steps = rollout.samples("step")
    assert [s.policy_version for s in steps] == [7, 8]
    [trajectory] = rollout.samples("trajectory")
    assert trajectory.policy_version == 7
    batch = to_batch(steps, encoder.pad_token_id)
    assert batch.tensors[C.POLICY_VERSION].tolist() == [7, 8]


class RaisesOnSecondStep(TwoTurnEnv):
    """TwoTurnEnv whose second step raises in user code (a helper frame the traceback must show)."""

    def step(self, action: str) -> StepResult:
        if self.t == 1:
            self._lookup(action)
        return super().step(action)

    def _lookup(self, action: str) -> None:
        raise KeyError(f"no transition for {action}")


def test_env_errors_carry_their_traceback_once_and_count_as_a_rate(encoder: ChatEncoder) -> None:
    """Four envs, two of which (slots 1 and 3) raise on their second step: env/errors = 2 / 4 = 0.5; both
    reports name env, kind, turn and seed; only the first carries the traceback (the worker sends one per kind)."""
    config = EnvManagerConfig(envs=[EnvEntryConfig(type="two_turn")])
    made = iter([TwoTurnEnv(), RaisesOnSecondStep(), TwoTurnEnv(), RaisesOnSecondStep()])
    pool = EnvSlots(4, lambda entry: next(made), timeout_s=5.0)
    answers = ["<answer>Left</answer>", "<answer>Up</answer>"]
    rollout = RolloutManager(config, pool, Scripted(encoder, answers), encoder, max_new_tokens=32).rollout(
        2, 2, batch_seed=0
    )
    assert rollout.metrics()["env/errors"] == 0.5
    first, second = rollout.errors
    assert (first.source, first.kind) == ("env two_turn", "KeyError") == (second.source, second.kind)
    assert "KeyError: 'no transition for Up' [step('Up') at turn 2, episode seed" in first.message
    assert first.traceback is not None and "in _lookup" in first.traceback and second.traceback is None
    assert [e.status for e in rollout.started] == ["done", "error", "done", "error"]


class BrokenTool:
    """A tool with a bug: its call raises instead of returning ``ToolResult(ok=False)``."""

    name, description = "lookup", "looks a word up"

    @property
    def parameters(self) -> dict[str, Any]:
        return {"type": "object", "properties": {"word": {"type": "string"}}}

    def call(self, arguments: dict[str, Any]) -> Any:
        return {}[arguments["word"]]

    def close(self) -> None:
        return None


def test_a_tool_that_raises_fails_the_env_step_with_the_tool_named_in_the_traceback() -> None:
    from roll.agentic.tools.wrapper import ToolEnvWrapper

    pool = EnvSlots(1, lambda entry: ToolEnvWrapper(TwoTurnEnv(), [BrokenTool()]), timeout_s=5.0)
    pool.reset([ResetRequest(0, 1)])
    call = '<tool_call>{"name": "lookup", "arguments": {"word": "cat"}}</tool_call>'
    (outcome,) = pool.step([StepRequest(call)])
    assert outcome is not None and outcome.error == "KeyError: 'cat'"
    assert outcome.traceback is not None and "in call" in outcome.traceback
    assert "in roll.tool 'lookup', called with arguments {'word': 'cat'}" in outcome.traceback
