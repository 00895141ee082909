"""Image observations through the env manager: vision tokens in the prompt, patches to ``generate`` and into the
samples' vision columns (in-process envs, a scripted policy, the tiny-vl tokenizer and image processor).

Golden numbers: the 3x3 lake at 16 px a cell is a 48x48 picture; the tiny-vl processor (patch 8, merge 2) keeps
48x48 (a multiple of 16 within its pixel bounds), so one image is a 6x6 patch grid, ``image_grid_thw = [1, 6, 6]``,
36 patches of 3 channels x 2 frames x 8 x 8 = 384 values, and 36 / 2**2 = 9 ``<|image_pad|>`` tokens.
"""

from __future__ import annotations

from typing import Any

import pytest

from roll.agentic.env_manager.batching import to_batch
from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.config import EnvEntryConfig, EnvManagerConfig
from roll.agentic.env_manager.manager import Generation, RolloutManager
from roll.agentic.env_manager.slots import EnvSlots
from roll.agentic.envs.frozen_lake import FrozenLakeConfig, FrozenLakeEnv
from roll.core import columns as C
from roll.core.errors import DataError

MAP = ["S__", "_O_", "__G"]
PADS_PER_IMAGE = 9


@pytest.fixture(scope="module")
def vl_encoder() -> ChatEncoder:
    from roll.data.tiny_vl import build_image_processor
    from roll.data.tokenizer import build_tokenizer

    return ChatEncoder(build_tokenizer("roll-tiny-vl"), build_image_processor("tiny-vl-1m"))


class Recorder:
    """Answers every prompt with ``answers[k]`` on the k-th call; records prompts and the ``vision`` kwarg."""

    def __init__(self, encoder: ChatEncoder, answers: list[str]) -> None:
        self.encoder, self.answers = encoder, iter(answers)
        self.calls: list[tuple[list[list[int]], Any]] = []

    def __call__(self, prompts: list[list[int]], *, seed: int, vision: Any = None) -> list[Generation]:
        self.calls.append((prompts, vision))
        ids = [*self.encoder.encode(next(self.answers)), self.encoder.eos_token_id]
        return [Generation(ids, [-0.5] * len(ids)) for _ in prompts]


def _rollout(encoder: ChatEncoder, answers: list[str], **overrides: Any) -> tuple[Any, Recorder]:
    config = EnvManagerConfig(envs=[EnvEntryConfig(type="frozen_lake")], **overrides)
    env_config = FrozenLakeConfig(observation="image", max_steps=4)
    pool = EnvSlots(1, lambda entry: FrozenLakeEnv(env_config, rows=MAP), timeout_s=5.0)
    generate = Recorder(encoder, answers)
    return RolloutManager(config, pool, generate, encoder, max_new_tokens=32).rollout(
        1, 1, batch_seed=0
    ), generate


def _pads(encoder: ChatEncoder, ids: list[int]) -> int:
    pad = encoder.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    return sum(t == pad for t in ids)


def test_trajectory_prompts_carry_every_image_so_far(vl_encoder: ChatEncoder) -> None:
    """Turn 1 shows the start (1 image), turn 2 both lakes (2 images, 18 pads); the sample holds both images,
    their pads are never trained, and to_batch puts them in the vision columns."""
    rollout, generate = _rollout(vl_encoder, ["<answer>Right</answer>"] * 2 + ["<answer>Down</answer>"] * 2)
    (p1, v1), (p2, v2) = generate.calls[:2]
    assert _pads(vl_encoder, p1[0]) == PADS_PER_IMAGE and v1[C.IMAGE_GRID_THW][0].tolist() == [[1, 6, 6]]
    assert (
        _pads(vl_encoder, p2[0]) == 2 * PADS_PER_IMAGE and v2[C.IMAGE_GRID_THW][0].tolist() == [[1, 6, 6]] * 2
    )
    assert tuple(v2[C.PIXEL_VALUES][0].shape) == (72, 384)
    assert not v1[C.PIXEL_VALUES][0].equal(v2[C.PIXEL_VALUES][0][36:])  # the player moved: another picture
    [sample] = rollout.samples("trajectory")
    turns = len(rollout.episodes[0].turns)
    assert turns == 4 and rollout.episodes[0].success  # Right Right Down Down reaches the goal
    assert sample.images is not None and sample.images.image_grid_thw.shape == (turns, 3)
    pad = vl_encoder.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert _pads(vl_encoder, sample.input_ids) == turns * PADS_PER_IMAGE
    assert all(m == 0 for t, m in zip(sample.input_ids, sample.loss_mask) if t == pad)
    batch = to_batch([sample], vl_encoder.pad_token_id)
    assert batch.non_tensors[C.PIXEL_VALUES][0].shape == (36 * turns, 384)


def test_step_rows_carry_their_own_image_and_distinct_anchors(vl_encoder: ChatEncoder) -> None:
    """history_window 0: every row shows one picture; (0,0) then (0,1) are two states, so two anchors."""
    rollout, _ = _rollout(
        vl_encoder,
        ["<answer>Right</answer>"] * 2 + ["<answer>Down</answer>"] * 2,
        mode="step",
        history_window=0,
    )
    samples = rollout.samples("step")
    assert all(s.images is not None and s.images.image_grid_thw.tolist() == [[1, 6, 6]] for s in samples)
    assert all(_pads(vl_encoder, s.input_ids) == PADS_PER_IMAGE for s in samples)
    assert samples[0].anchor != samples[1].anchor


def test_text_rows_have_no_vision_columns(vl_encoder: ChatEncoder) -> None:
    """A text env's batch keeps exactly the text columns (and generate is called without ``vision``)."""
    config = EnvManagerConfig(envs=[EnvEntryConfig(type="frozen_lake")])
    pool = EnvSlots(1, lambda entry: FrozenLakeEnv(FrozenLakeConfig(max_steps=1), rows=MAP), timeout_s=5.0)
    generate = Recorder(vl_encoder, ["<answer>Right</answer>"])
    rollout = RolloutManager(config, pool, generate, vl_encoder, max_new_tokens=32).rollout(
        1, 1, batch_seed=0
    )
    assert generate.calls[0][1] is None
    batch = to_batch(rollout.samples("trajectory"), vl_encoder.pad_token_id)
    assert not set(C.VISION_COLUMNS) & set(batch.non_tensors)


def test_image_env_needs_a_vision_language_policy() -> None:
    from roll.data.tokenizer import build_tokenizer

    with pytest.raises(DataError, match="no image processor"):
        _rollout(ChatEncoder(build_tokenizer("roll-tiny-vl")), ["<answer>Right</answer>"])
