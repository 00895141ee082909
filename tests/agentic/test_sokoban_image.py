"""Sokoban with ``observation: image`` and the grid drawing it shares with FrozenLake: hand-worked pixels at named
cells, and the game (levels, rewards, flags, expert actions) equal to the text env's."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from roll.agentic.env_manager.slots import build_env
from roll.agentic.envs.grid_image import draw_grid
from roll.agentic.envs.sokoban import SokobanConfig, SokobanEnv, render_rgb
from roll.agentic.pipeline.agentic import AgenticConfig
from roll.agentic.types import (
    EXPERT_ACTION,
    IMAGE_MARKER,
    EnvError,
    ImageObservation,
    StepResult,
    split_observation,
)
from roll.core.config.loader import load_config

WALL, FLOOR, TARGET = (110, 70, 50), (30, 30, 30), (200, 50, 50)
BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = (220, 180, 60), (60, 200, 80), (70, 130, 230), (170, 90, 220)

# Player (1, 1) on floor, a box (1, 2), floor (1, 3), a target (1, 4), a box on a target (2, 1).
LEVEL = "######\n#PX_O#\n#√___#\n######"
# Player on a target (1, 1), a box (1, 2) to push right, a second box (2, 1) for the target (1, 4).
LEVEL_ON_TARGET = "######\n#SX_O#\n#X___#\n######"
MOVES = ["Up", "Down", "Left", "Right", "Jump"]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agentic_vlm_sokoban.yaml"


def pixels(observation: object) -> np.ndarray:
    assert isinstance(observation, ImageObservation)
    (image,) = observation.images
    return np.asarray(image)


def at(px: np.ndarray, y: int, x: int) -> tuple[int, ...]:
    return tuple(int(v) for v in px[y, x])


def outcome(result: StepResult) -> tuple[object, ...]:
    return result.reward, result.terminated, result.truncated, result.info


def image_env(level: str) -> SokobanEnv:
    return SokobanEnv(SokobanConfig(level=level, observation="image", tile_size=16))


def test_draw_grid_hand_worked() -> None:
    """Two 4-px cells side by side (8 wide, 4 high), a piece inset 1 px on the right one: pixels x 5-6, y 1-2
    take its colour, x 4 and x 7 (and y 0, y 3) keep the tile's; the left cell is its tile throughout."""
    red, blue, white = (255, 0, 0), (0, 0, 255), (255, 255, 255)
    px = np.asarray(draw_grid([[red, blue]], 4, {(0, 1): white}, inset_px=1))
    assert px.shape == (4, 8, 3)
    assert at(px, 0, 0) == at(px, 3, 3) == red
    assert at(px, 1, 5) == at(px, 2, 6) == white
    assert at(px, 1, 4) == at(px, 1, 7) == at(px, 0, 5) == at(px, 3, 6) == blue
    with pytest.raises(EnvError, match="inset_px"):
        draw_grid([[red]], 4, {}, inset_px=2)


def test_observation_is_one_marker_and_the_room_drawn() -> None:
    """4x6 room at 16 px a cell: a 64x96 picture; cell (r, c) has its centre at (16r + 8, 16c + 8). Pieces are
    inset by 16 // 5 = 3 px, so pixel (16r + 1, 16c + 1) shows the tile under a piece. Pushing Right moves the
    player to (1, 2) and the box to (1, 3); (1, 1) is then bare floor."""
    env = image_env(LEVEL)
    observation, _ = env.reset(seed=0)
    text, images = split_observation(observation)
    assert text.count(IMAGE_MARKER) == 1 and len(images) == 1 and "picture" in env.system_prompt
    px = pixels(observation)
    assert px.shape == (64, 96, 3)
    assert at(px, 8, 8) == at(px, 56, 88) == WALL
    assert at(px, 24, 24) == PLAYER and at(px, 17, 17) == FLOOR
    assert at(px, 24, 40) == BOX
    assert at(px, 24, 56) == FLOOR
    assert at(px, 24, 72) == TARGET
    assert at(px, 40, 24) == BOX_ON_TARGET and at(px, 33, 17) == TARGET
    assert np.array_equal(env.render("rgb_array"), px)
    after = pixels(env.step("Right").observation)
    assert at(after, 24, 24) == FLOOR and at(after, 24, 40) == PLAYER and at(after, 24, 56) == BOX


def test_player_on_a_target_has_its_own_colour() -> None:
    """The player on the target (1, 1) is violet over the red tile; after pushing Right it is blue on floor
    (1, 2) and (1, 1) is a bare target."""
    env = image_env(LEVEL_ON_TARGET)
    px = pixels(env.reset(seed=0)[0])
    assert at(px, 24, 24) == PLAYER_ON_TARGET and at(px, 17, 17) == TARGET
    after = pixels(env.step("Right").observation)
    assert at(after, 24, 24) == TARGET and at(after, 24, 40) == PLAYER and at(after, 24, 56) == BOX


def test_game_is_the_text_envs() -> None:
    """Generated 6x6 one-box levels, seeds 0-11, the same actions (the expert's move 70% of the time, otherwise a
    random one or an invalid word): rewards, flags and info (expert actions included) equal step by step, every
    picture is the drawing of the text env's level, and some episodes are won (so the win reward is compared)."""
    rng = random.Random(0)
    wins = 0
    for seed in range(12):
        config = SokobanConfig(max_steps=12, expert=True)
        text_env, img_env = SokobanEnv(config), SokobanEnv(config.model_copy(update={"observation": "image"}))
        (text_obs, info), (image_obs, image_info) = text_env.reset(seed=seed), img_env.reset(seed=seed)
        assert isinstance(text_obs, str) and info == image_info and info[EXPERT_ACTION] is not None
        assert np.array_equal(pixels(image_obs), render_rgb(text_env.level))  # type: ignore[arg-type]
        done = False
        while not done:
            expert = info.get(EXPERT_ACTION)
            action = expert if expert and rng.random() < 0.7 else rng.choice(MOVES)
            a, b = text_env.step(action), img_env.step(action)
            assert outcome(a) == outcome(b)
            assert np.array_equal(pixels(b.observation), render_rgb(text_env.level))  # type: ignore[arg-type]
            info, done = a.info, a.done
        wins += a.info["success"]
    assert wins > 0


def test_example_builds_an_image_sokoban() -> None:
    """examples/agentic_vlm_sokoban.yaml's env, built through its entry point as the env manager does: a 5x5
    room at 16 px is an 80x80 picture (10x10 patches of 8 px for tiny-vl-1m, 25 image-pad tokens after the 2x2
    merge), with an expert move after reset."""
    config = load_config(EXAMPLE, [], model=AgenticConfig)
    assert config.policy_model.path == "tiny-vl-1m"
    [entry] = config.env_manager.envs
    observation, info = build_env(entry).reset(seed=0)
    assert pixels(observation).shape == (80, 80, 3) and info[EXPERT_ACTION] in MOVES
