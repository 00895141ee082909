"""FrozenLake with ``observation: image``: the picture is a pure function of the state (so deterministic per
seed) and the game (maps, moves, rewards, expert actions) is the text env's."""

from __future__ import annotations

import random

import numpy as np
import pytest

from roll.agentic.envs.frozen_lake import FrozenLakeConfig, FrozenLakeEnv
from roll.agentic.types import EXPERT_ACTION, IMAGE_MARKER, EnvError, ImageObservation, split_observation

MAP = ["S_O", "___", "O_G"]


def pixels(observation: object) -> np.ndarray:
    assert isinstance(observation, ImageObservation)
    (image,) = observation.images
    return np.asarray(image)


def test_observation_is_text_with_one_marker_and_the_grid_drawn() -> None:
    """3x3 map at 16 px a cell: a 48x48 picture. Cell (r, c) has its centre at (16r + 8, 16c + 8); the player
    (0, 0) is red there, the hole (0, 2) blue, the goal (2, 2) green, ice (1, 1) grey; the player square is inset
    by 16 // 4 = 4 px, so pixel (1, 1) of the player's cell is still ice."""
    env = FrozenLakeEnv(FrozenLakeConfig(observation="image"), rows=MAP)
    observation, _ = env.reset(seed=0)
    text, images = split_observation(observation)
    assert text.count(IMAGE_MARKER) == 1 and len(images) == 1
    px = pixels(observation)
    assert px.shape == (48, 48, 3)
    assert tuple(px[8, 8]) == (220, 30, 30)
    assert tuple(px[8, 40]) == (20, 40, 140)
    assert tuple(px[40, 40]) == (30, 170, 60)
    assert tuple(px[24, 24]) == tuple(px[1, 1]) == (220, 220, 220)
    assert np.array_equal(env.render("rgb_array"), px)
    after = env.step("Down").observation
    assert tuple(pixels(after)[24, 8]) == (220, 30, 30) and tuple(pixels(after)[8, 8]) == (220, 220, 220)


def test_render_is_deterministic_per_seed() -> None:
    """Two envs reset with seed 7 draw the same bytes; seed 8 generates another 4x4 map (so another picture)."""
    first = [pixels(FrozenLakeEnv(FrozenLakeConfig(observation="image")).reset(seed=s)[0]) for s in (7, 7, 8)]
    assert np.array_equal(first[0], first[1])
    assert not np.array_equal(first[0], first[2])


@pytest.mark.parametrize("slippery", [False, True])
def test_game_is_the_text_envs(slippery: bool) -> None:
    """Same seeds and actions: rewards, flags and info (expert actions included) equal step by step, and each
    picture is the drawing of the text env's state."""
    rng = random.Random(0)
    for seed in range(20):
        text_env = FrozenLakeEnv(FrozenLakeConfig(slippery=slippery))
        image_env = FrozenLakeEnv(FrozenLakeConfig(slippery=slippery, observation="image"))
        (_, text_info), (_, image_info) = text_env.reset(seed=seed), image_env.reset(seed=seed)
        assert text_info == image_info and image_info[EXPERT_ACTION] is not None
        done = False
        while not done:
            action = rng.choice(["Up", "Down", "Left", "Right", "Jump"])
            a, b = text_env.step(action), image_env.step(action)
            assert (a.reward, a.terminated, a.truncated, a.info) == (
                b.reward,
                b.terminated,
                b.truncated,
                b.info,
            )
            assert isinstance(a.observation, str) and np.array_equal(
                pixels(b.observation), text_env.render("rgb_array")
            )
            done = a.done


def test_marker_count_must_match_images() -> None:
    with pytest.raises(EnvError, match="one <image> per image"):
        ImageObservation("no marker", (object(),))
