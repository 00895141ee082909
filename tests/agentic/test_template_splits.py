"""Chat templates that rewrite history (Qwen3 drops earlier turns' reasoning) split a trajectory into segments.

A scripted policy plays a hand-made 3-turn env with the thinking kit's Qwen3-like template (roll-tiny-think), so
every segment's ids, mask and prompt are derived by hand from the template's text; the same episode with the
ChatML template (roll-tiny) stays one row, exactly as before. The advantage of a split trajectory is computed
once per trajectory (GRPO golden numbers below) and packing is exact for an unsplit batch (every estimator).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from roll.agentic.env_manager.batching import to_batch
from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.config import EnvEntryConfig, EnvManagerConfig
from roll.agentic.env_manager.manager import Generation, Rollout, RolloutManager
from roll.agentic.env_manager.slots import EnvSlots
from roll.agentic.pipeline.agentic.trajectories import pack, trajectory_advantages, unpack
from roll.agentic.types import StepResult
from roll.core import columns as C
from roll.core.errors import DataError

SYSTEM = "Go. Valid actions: Left, Up"
HEAD = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nobs one<|im_end|>\n<|im_start|>assistant\n"
THINK_LEFT = "<think>\nhmm\n</think>\n\n<answer>Left</answer>"
PLAIN_UP = "<answer>Up</answer>"
THINK_UP = "<think>\nso\n</think>\n\n<answer>Up</answer>"


class ThreeTurnEnv:
    """Observations 'obs one', 'obs two', 'obs three'; rewards 0, 0, then 1 (success on Up); three steps."""

    max_steps = 3
    system_prompt = SYSTEM
    action_space_text = "Valid actions: Left, Up"

    def __init__(self) -> None:
        self.t = 0

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.t = 0
        return "obs one", {}

    def step(self, action: str) -> StepResult:
        self.t += 1
        done = self.t >= 3
        reward = 1.0 if done and action == "Up" else 0.0
        return StepResult(["obs two", "obs three", "end"][self.t - 1], reward, done, False, {"success": done})

    def render(self, mode: str = "text") -> str:
        return f"t={self.t}"

    def close(self) -> None:
        return None


class Scripted:
    """Answers the k-th call with ``answers[k]`` (ids + eos, log-prob -0.25 - k) and records what it was given."""

    def __init__(self, encoder: ChatEncoder, answers: list[str]) -> None:
        self.encoder, self.answers = encoder, answers
        self.prompts: list[list[int]] = []
        self.sampled: list[list[int]] = []

    def __call__(self, prompts: list[list[int]], *, seed: int) -> list[Generation]:
        k = len(self.prompts)
        ids = [*self.encoder.encode(self.answers[k]), self.encoder.eos_token_id]
        self.prompts.append(prompts[0])
        self.sampled.append(ids)
        return [Generation(ids, [-0.25 - k] * len(ids))]


@pytest.fixture(scope="module")
def think() -> ChatEncoder:
    from roll.data.tokenizer import build_tokenizer

    return ChatEncoder(build_tokenizer("roll-tiny-think"))


@pytest.fixture(scope="module")
def chatml() -> ChatEncoder:
    from roll.data.tokenizer import build_tokenizer

    return ChatEncoder(build_tokenizer("roll-tiny"))


def _play(
    encoder: ChatEncoder, answers: list[str], config: EnvManagerConfig | None = None
) -> tuple[Rollout, Scripted]:
    config = config or EnvManagerConfig(envs=[EnvEntryConfig(type="three_turn")])
    policy = Scripted(encoder, answers)
    manager = RolloutManager(
        config, EnvSlots(1, lambda entry: ThreeTurnEnv(), 5.0), policy, encoder, max_new_tokens=32
    )
    return manager.rollout(1, 1, batch_seed=0), policy


def _pieces(encoder: ChatEncoder, parts: list[tuple[str, int]]) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    mask: list[int] = []
    for text, trained in parts:
        piece = encoder.encode(text)
        ids, mask = ids + piece, mask + [trained] * len(piece)
    return ids, mask


def test_a_history_rewriting_template_splits_a_three_turn_episode_as_derived_by_hand(
    think: ChatEncoder,
) -> None:
    """Turn 0 thinks, turn 1 answers plainly, turn 2 thinks. The template keeps reasoning only after the last
    user turn, so after turn 0 the next prompt shows turn 0 as '<answer>Left</answer>' alone, not what the model
    produced: split. Turn 1 had no reasoning, so the prompt of turn 2 extends turn 1 verbatim: no split. Two
    segments, [turn 0] and [turns 1, 2]; each starts with the prompt the policy was given."""
    rollout, policy = _play(think, [THINK_LEFT, PLAIN_UP, THINK_UP])
    [episode] = rollout.episodes
    assert episode.splits == 1 and [s.first_turn for s in episode.segments()] == [0, 1]
    first, second = rollout.samples("trajectory")
    seg0 = _pieces(think, [(HEAD, 0), (THINK_LEFT + "<|im_end|>", 1)])
    history = (
        HEAD + "<answer>Left</answer><|im_end|>\n<|im_start|>user\nobs two<|im_end|>\n<|im_start|>assistant\n"
    )
    seg1 = _pieces(
        think,
        [
            (history, 0),
            (PLAIN_UP + "<|im_end|>", 1),
            ("\n<|im_start|>user\nobs three<|im_end|>\n<|im_start|>assistant\n", 0),
            (THINK_UP + "<|im_end|>", 1),
        ],
    )
    assert (first.input_ids, first.loss_mask) == seg0
    assert (second.input_ids, second.loss_mask) == seg1
    assert (first.segment, second.segment) == (0, 1)
    # What the policy was given at each turn: a segment's own prompt, then its ids up to the turn.
    assert policy.prompts[0] == seg0[0][: seg0[1].index(1)]
    assert policy.prompts[1] == seg1[0][: seg1[1].index(1)]
    assert policy.prompts[2] == think.encode(
        history + PLAIN_UP + "<|im_end|>\n<|im_start|>user\nobs three<|im_end|>\n<|im_start|>assistant\n"
    )
    # The trained ids are the sampled ids, turn by turn, with their log-probs.
    trained = [i for s in (first, second) for i, m in zip(s.input_ids, s.loss_mask) if m]
    assert trained == [t for turn in policy.sampled for t in turn]
    logp = [lp for s in (first, second) for lp, m in zip(s.logp, s.loss_mask) if m]
    assert logp == [-0.25 - k for k, turn in enumerate(policy.sampled) for _ in turn]
    # The return (1.0) counts once: on the last segment's last trained token; both rows score it.
    batch = to_batch([first, second], think.pad_token_id)
    assert batch.tensors[C.TOKEN_REWARDS].sum().item() == 1.0
    assert batch.tensors[C.TOKEN_REWARDS][1, len(seg1[0]) - 1].item() == 1.0
    assert batch.tensors[C.SCORES].tolist() == [1.0, 1.0]
    assert batch.tensors[C.SEGMENT].tolist() == [0, 1]
    metrics = rollout.metrics()
    assert metrics["env/template_splits"] == 1.0 and metrics["env/segments"] == 2.0
    assert metrics["env/return"] == 1.0 and metrics["env/turns"] == 3.0  # once per trajectory


def test_a_prefix_consistent_template_keeps_one_row_as_before(chatml: ChatEncoder) -> None:
    """The same answers with ChatML: one segment, the whole conversation as the template renders it."""
    rollout, policy = _play(chatml, [THINK_LEFT, PLAIN_UP, THINK_UP])
    [sample] = rollout.samples("trajectory")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "obs one"}]
    for answer, obs in zip([THINK_LEFT, PLAIN_UP, THINK_UP], ["obs two", "obs three", None]):
        messages.append({"role": "assistant", "content": answer})
        if obs:
            messages.append({"role": "user", "content": obs})
    full = chatml.tokenizer.apply_chat_template(messages, tokenize=False).removesuffix("\n")
    assert sample.input_ids == chatml.encode(full)
    assert [i for i, m in zip(sample.input_ids, sample.loss_mask) if m] == [
        t for turn in policy.sampled for t in turn
    ]
    assert rollout.metrics()["env/template_splits"] == 0.0 and sample.segment == 0


def test_the_split_happens_only_where_reasoning_was_dropped(think: ChatEncoder) -> None:
    """No turn thinks: the Qwen3-like history is then the model's text verbatim and nothing splits (the empty
    think block the template gives a *last* turn never reaches a prompt)."""
    rollout, policy = _play(think, [PLAIN_UP, PLAIN_UP, PLAIN_UP])
    [sample] = rollout.samples("trajectory")
    assert rollout.episodes[0].splits == 0
    assert [i for i, m in zip(sample.input_ids, sample.loss_mask) if m] == [
        t for turn in policy.sampled for t in turn
    ]


class _Template:
    """A tokenizer stand-in whose chat template is ``render``: the ChatEncoder reads nothing else of it."""

    def __init__(self, base: Any, render: Any) -> None:
        self.base, self.render = base, render
        self.chat_template = "custom"
        self.eos_token_id, self.eos_token, self.pad_token_id = base.eos_token_id, base.eos_token, None

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        return str(self.render(messages, kwargs["add_generation_prompt"]))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.base.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self.base.decode(ids, skip_special_tokens=skip_special_tokens))


def test_templates_broken_in_other_ways_are_still_rejected_loudly(chatml: ChatEncoder) -> None:
    """A template that leaves the env's answer out of the prompt, or that raises, stops the run naming why."""
    base = chatml.tokenizer

    def last_only(messages: list[dict[str, str]], gen: bool) -> str:
        return f"<|im_start|>system\n{messages[0]['content']}<|im_end|>\n" + ("<|im_start|>assistant\n" * gen)

    with pytest.raises(DataError, match="leaves the env's answer out"):
        _play(ChatEncoder(_Template(base, last_only)), [PLAIN_UP] * 3)

    def alternating(messages: list[dict[str, str]], gen: bool) -> str:
        if len(messages) > 2:
            raise ValueError("Conversation roles must alternate user/assistant/user/assistant")
        return str(base.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen))

    with pytest.raises(DataError, match=r"roles: system, user, assistant, user\): ValueError: .*alternate"):
        _play(ChatEncoder(_Template(base, alternating)), [PLAIN_UP] * 3)


# ------------------------------------------------------------------------------------- template kwargs

EMPTY_THINK = "<think>\n\n</think>\n\n"


def test_enable_thinking_false_prefills_the_empty_think_block_in_every_prompt(think: ChatEncoder) -> None:
    """``env_manager.chat_template_kwargs: {enable_thinking: false}`` reaches every render. The Qwen3-like
    template then ends every generation prompt with an empty think block, and shows earlier answers without it,
    so each next prompt rewrites what the model saw: three segments, each prompt derived by hand, each ending
    with the empty block; the trained ids are still exactly the sampled ones. Without the key, no prompt holds
    a think block."""
    config = EnvManagerConfig(
        envs=[EnvEntryConfig(type="three_turn")], chat_template_kwargs={"enable_thinking": False}
    )
    encoder = ChatEncoder(think.tokenizer, template_kwargs=config.chat_template_kwargs)
    rollout, policy = _play(encoder, [PLAIN_UP] * 3, config)
    turn = "<answer>Up</answer><|im_end|>\n<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n"
    one = HEAD + turn.format(obs="obs two")
    expected = [HEAD, one, one + turn.format(obs="obs three")]
    assert policy.prompts == [think.encode(text + EMPTY_THINK) for text in expected]
    segments = rollout.samples("trajectory")
    assert [s.segment for s in segments] == [0, 1, 2] and rollout.episodes[0].splits == 2
    for sample, prompt, sampled in zip(segments, policy.prompts, policy.sampled):
        assert sample.input_ids == prompt + sampled
        assert sample.loss_mask == [0] * len(prompt) + [1] * len(sampled)
    _, plain = _play(think, [PLAIN_UP] * 3)
    think_id = think.tokenizer.convert_tokens_to_ids("<think>")
    assert all(think_id not in prompt for prompt in plain.prompts)
    assert all(prompt.count(think_id) == 1 for prompt in policy.prompts)


def test_bad_template_kwargs_are_loud_config_errors_naming_the_key(think: ChatEncoder) -> None:
    """Checked when the encoder is built: a name the template never reads (a typo Jinja would ignore), a value
    the template raises on, and an argument the encoder sets itself each stop the run naming the key."""
    from pydantic import ValidationError

    from roll.core.errors import ConfigError
    from roll.data.tokenizer import build_tokenizer

    with pytest.raises(ConfigError, match=r"env_manager\.chat_template_kwargs\.enable_thinkng: .*reads no"):
        ChatEncoder(think.tokenizer, template_kwargs={"enable_thinkng": False})
    strict = build_tokenizer("roll-tiny-think")
    strict.chat_template = (
        "{%- if enable_thinking is defined and enable_thinking is not boolean -%}"
        "{{- raise_exception('enable_thinking must be true or false') -}}{%- endif -%}"
        + think.tokenizer.chat_template
    )
    ChatEncoder(strict, template_kwargs={"enable_thinking": True})  # a good value passes
    with pytest.raises(
        ConfigError, match=r"env_manager\.chat_template_kwargs\.enable_thinking='no': .*must be true or false"
    ):
        ChatEncoder(strict, template_kwargs={"enable_thinking": "no"})
    with pytest.raises(ValidationError, match="add_generation_prompt: set by the chat encoder itself"):
        EnvManagerConfig(chat_template_kwargs={"add_generation_prompt": False})


# ------------------------------------------------------------------------------------------- advantages


def _objective(estimator: str) -> Any:
    from roll.pipelines.algorithms.presets import AlgorithmConfig
    from roll.pipelines.policy.objective import PolicyObjective

    critic = estimator == "gae"  # GAE reads the critic's values
    algo = AlgorithmConfig(
        preset="grpo", kl_mode="none", loss_agg_mode="token-mean", adv_estimator=estimator, use_critic=critic
    )
    return PolicyObjective(algo)


def _rows(mask_rows: list[list[int]], episodes: list[int], segments: list[int], scores: list[float]) -> Any:
    from roll.core.batch import Batch

    mask_BT = torch.tensor(mask_rows)
    return Batch(
        {
            C.RESPONSE_MASK: mask_BT,
            C.SCORES: torch.tensor(scores),
            C.GROUP_ID: torch.zeros(len(scores), dtype=torch.long),
            C.EPISODE_ID: torch.tensor(episodes),
            C.SEGMENT: torch.tensor(segments),
            C.OLD_VALUES: torch.arange(mask_BT.numel(), dtype=torch.float32).reshape(mask_BT.shape) / 10,
        },
        {C.TAG: ["t"] * len(scores)},
    )


def test_a_split_trajectory_counts_once_in_its_group() -> None:
    """GRPO over a group of two trajectories: A (return 1) split in two segments, B (return 0) not. Per
    trajectory: mean 0.5, std sqrt(0.5^2 * 2 / 1) = 0.70711, so every trained token of A gets
    0.5 / (0.70711 + 1e-6) = 0.70711 and of B -0.70711. (Row by row, A would count twice: mean 2/3, std
    sqrt((1/9 + 1/9 + 4/9) / 2) = 0.57735, advantages 0.57735 and -1.1547.)"""
    batch = _rows([[0, 1, 1, 0], [0, 0, 1, 1], [0, 1, 1, 1]], [0, 0, 1], [0, 1, 0], [1.0, 1.0, 0.0])
    out = trajectory_advantages(_objective("grpo"), batch)
    want = 0.5 / (0.5**0.5 + 1e-6)
    expected = torch.tensor([[0, want, want, 0], [0, 0, want, want], [0, -want, -want, -want]])
    torch.testing.assert_close(out.tensors[C.ADVANTAGES], expected)


def test_a_split_trajectory_gets_its_return_to_go_across_segments() -> None:
    """REINFORCE++ with gamma 1: the outcome sits on the trajectory's last trained token only (its last
    segment's), and every earlier token of every segment carries it back, as the unsplit row would."""
    batch = _rows([[1, 1, 0], [0, 1, 1], [1, 1, 1]], [0, 0, 1], [0, 1, 0], [2.0, 2.0, 0.0])
    packed, index = pack(batch)
    assert packed.tensors[C.RESPONSE_MASK].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    torch.testing.assert_close(packed.tensors[C.OLD_VALUES][0], torch.tensor([0.0, 0.1, 0.4, 0.5]))
    from roll.pipelines.algorithms.estimators import AdvantageInputs, EstimatorParams, estimate_advantages

    inputs = AdvantageInputs(packed.tensors[C.SCORES], packed.tensors[C.RESPONSE_MASK])
    returns = estimate_advantages("reinforce_pp", inputs, EstimatorParams(gamma=1.0)).returns_BT
    assert returns is not None
    torch.testing.assert_close(unpack(returns, index), torch.tensor([[2.0, 2, 0], [0, 2, 2], [0, 0, 0]]))


@pytest.mark.parametrize(
    "estimator", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"]
)
def test_packing_an_unsplit_batch_changes_nothing(estimator: str) -> None:
    """Without splits the pipeline estimates row by row, as before; packing such a batch anyway gives the same
    advantages and returns for every estimator, so the packed path is exact (only trained positions matter)."""
    mask = [[0, 1, 1, 0, 0], [1, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 1, 0, 1, 0]]
    scores = [1.0, 0.0, 0.5, 1.0]
    objective = _objective(estimator)
    direct = objective.advantages(_rows(mask, [0, 1, 2, 3], [0] * 4, scores), torch.tensor(scores))
    packed, index = pack(_rows(mask, [0, 1, 2, 3], [0] * 4, scores))
    packed = objective.advantages(packed, packed.tensors[C.SCORES])
    torch.testing.assert_close(unpack(packed.tensors[C.ADVANTAGES], index), direct.tensors[C.ADVANTAGES])
    if C.RETURNS in direct.tensors:
        torch.testing.assert_close(unpack(packed.tensors[C.RETURNS], index), direct.tensors[C.RETURNS])


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_the_policy_loss_counts_a_split_trajectory_once(mode: str) -> None:
    """Trajectory A (4 trained tokens, return 1) split in rows of 1 and 3 tokens, next to B (2 tokens, return 0),
    against the same tokens unsplit. The split rows get seq_units_B 1/2, 1/2, 1 and seq_tokens_B 4, 4, 2
    (B's row: 1 and 2); they reach the loss through the trainer's column view; the policy loss counts 2 sequences,
    not 3, and its per-sequence value is the unsplit batch's. The per-token loss differs token by token (PPO with
    old log-probs -0.01 * (1..4)), so a per-row mean would not do."""
    from roll.pipelines.algorithms.losses import PolicyLoss
    from roll.pipelines.algorithms.presets import AlgorithmConfig
    from roll.pipelines.policy.group import POLICY_COLUMNS
    from roll.pipelines.policy.views import training_view
    from roll.workers.types import ForwardOutput

    old = [-0.01, -0.02, -0.03, -0.04]
    unsplit = _rows([[1, 1, 1, 1], [1, 1, 0, 0]], [0, 1], [0, 0], [1.0, 0.0])
    unsplit[C.OLD_LOGP] = torch.tensor([old, [-0.05, -0.06, 0, 0]])
    split = _rows([[1, 0, 0, 0], [0, 1, 1, 1], [1, 1, 0, 0]], [0, 0, 1], [0, 1, 0], [1.0, 1.0, 0.0])
    split[C.OLD_LOGP] = torch.tensor([[old[0], 0, 0, 0], [0, *old[1:]], [-0.05, -0.06, 0, 0]])
    objective = _objective("grpo")
    split = trajectory_advantages(objective, split)
    unsplit = trajectory_advantages(objective, unsplit)
    assert split.tensors[C.SEQ_UNITS].tolist() == [0.5, 0.5, 1.0]
    assert split.tensors[C.SEQ_TOKENS].tolist() == [4.0, 4.0, 2.0]
    assert C.SEQ_UNITS not in unsplit.tensors  # nothing split: the batch is as before
    algo = AlgorithmConfig(preset="grpo", kl_mode="none", loss_agg_mode=mode)  # type: ignore[arg-type]
    loss = PolicyLoss(algo, norm_len=4, use_old_logp=True)
    values = []
    for batch in (split, unsplit):
        micro = training_view(batch, POLICY_COLUMNS).tensors
        value, _ = loss(ForwardOutput(torch.zeros_like(micro[C.OLD_LOGP])), micro)
        assert loss.count_units(micro) == 2.0
        values.append(value / loss.count_units(micro))
    torch.testing.assert_close(values[0], values[1])
    split_as_rows = {
        k: v
        for k, v in training_view(split, POLICY_COLUMNS).tensors.items()
        if k not in (C.SEQ_UNITS, C.SEQ_TOKENS)
    }
    as_rows, _ = loss(ForwardOutput(torch.zeros(3, 4)), split_as_rows)
    assert loss.count_units(split_as_rows) == 3.0
    assert not torch.isclose(as_rows / 3, values[1])  # without the shares A would weigh twice


# ------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_thinking_model_trains_on_exactly_what_it_sampled(ray_local: Any, tmp_path: Any) -> None:
    """Two agentic GRPO steps with tiny-think-1m (the Qwen3-like template) on 3-round guess-the-direction, on
    Ray (hybrid placement). A short warm-up teaches the think-then-answer format, so turns carry reasoning that
    the template drops from later prompts: trajectories split. For every kept episode, the training batch's
    trained ids (over its segments, in order) are the ids the inference worker sampled, with its log-probs;
    each segment's untrained prefix is the prompt the worker was given at that segment's first turn; the
    trainer's recomputed log-probs of those tokens match the sampler's; the split count is logged, returns count
    once per trajectory, and the steps train. Measured: 14 and 13 splits of 32 turn changes (30 and 29 rows for
    16 trajectories), trainer-sampler log-prob gap at most 3e-6; 85-93 s at a load of 16-23 on 2 cores."""
    from roll.agentic.pipeline.agentic import SPEC as AGENTIC
    from roll.agentic.pipeline.agentic import AgenticConfig
    from roll.core.config.loader import load_config
    from roll.core.testing import read_metrics

    examples = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples"
    overrides = [
        f"output_dir={tmp_path}", "max_steps=2", "placement=hybrid", "actor_train.model.path=tiny-think-1m",
        "batch.prompts_per_step=4", "batch.samples_per_prompt=4", "batch.micro_batch_samples=16",
        "env_manager.envs=[{type: guess_direction, options: {num_directions: 2, max_steps: 3}}]",
        "rollout.max_new_tokens=24", "warmup.steps=30", "warmup.expert_fraction=0.0",
        "warmup.answer_template='<think>\nok\n</think>\n\n<answer>{action}</answer>'",
        "eval_every=0", "plot=false", "tracking.backends=[jsonl]", "tracking.progress=false",
    ]  # fmt: skip
    config = load_config(examples / "agentic_guess.yaml", overrides, model=AgenticConfig)
    pipeline = AGENTIC.build(config)
    recipe: Any = pipeline.recipe  # type: ignore[attr-defined]
    seen: list[tuple[Any, Any]] = []
    rollouts: dict[int, Any] = {}
    rollout, advantages = recipe.rollout, recipe.advantages
    recipe.rollout = lambda step: rollouts.setdefault(step, rollout(step))
    recipe.advantages = lambda samples: seen.append((samples, advantages(samples))) or seen[-1][1]
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    metrics = read_metrics(tmp_path)
    splits = 0
    for step, (samples, batch) in enumerate(seen):
        episodes = rollouts[step].episodes
        ids_BT, mask_BT, logp_BT = (batch.tensors[k] for k in (C.INPUT_IDS, C.RESPONSE_MASK, C.INFER_LOGP))
        episode_B, segment_B = batch.tensors[C.EPISODE_ID].tolist(), batch.tensors[C.SEGMENT].tolist()
        for episode in episodes:
            rows = sorted((segment_B[b], b) for b in range(len(samples)) if episode_B[b] == episode.index)
            trained = [ids_BT[b][mask_BT[b].bool()].tolist() for _, b in rows]
            assert [t for part in trained for t in part] == [
                t for turn in episode.turns for t in turn.response_ids
            ]
            logps = torch.cat([logp_BT[b][mask_BT[b].bool()] for _, b in rows])
            want = torch.tensor([lp for turn in episode.turns for lp in turn.response_logp])
            torch.testing.assert_close(logps, want)
            for (_, b), segment in zip(rows, episode.segments()):
                start = int(mask_BT[b].nonzero()[0])
                assert ids_BT[b][:start].tolist() == episode.turns[segment.first_turn].prompt_ids
            splits += episode.splits
        m = metrics[step + 1]
        assert m["env/template_splits"] == sum(e.splits for e in episodes)
        assert m["trajectories"] == len(episodes) and m["samples"] == len(samples)
        assert m["env/return"] == pytest.approx(sum(e.total_reward for e in episodes) / len(episodes))
        assert m["actor/updates"] >= 1
        # The trainer's log-probs of the trained tokens, each in its segment's context, are the sampler's.
        assert m["actor/mismatch/logp_abs_diff_max"] < 1e-3
    assert splits > 0, "the warm-up should make the policy think, and the template then splits"
