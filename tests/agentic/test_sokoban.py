"""Sokoban rules, rewards, rendering and the level generator (checked by a BFS solver)."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from pydantic import ValidationError

from roll.agentic.envs.sokoban import SokobanConfig, SokobanEnv, render_rgb
from roll.agentic.envs.sokoban_gen import DIRECTIONS, SokobanLevel
from roll.agentic.types import Env, EnvError


def make(level: str, **kw: object) -> SokobanEnv:
    env = SokobanEnv(SokobanConfig(level=level, **kw))
    env.reset(seed=0)
    return env


def solve(level: SokobanLevel, limit: int = 200_000) -> int | None:
    """Length of a shortest solution (moves), by BFS over (player, boxes); None if unsolvable."""
    start = (level.player, level.boxes)
    seen, queue = {start}, deque([(start, 0)])
    while queue:
        (player, boxes), dist = queue.popleft()
        if boxes == level.targets:
            return dist
        for dr, dc in DIRECTIONS.values():
            nxt = (player[0] + dr, player[1] + dc)
            if nxt in level.walls:
                continue
            new_boxes = boxes
            if nxt in boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond in level.walls or beyond in boxes:
                    continue
                new_boxes = (boxes - {nxt}) | {beyond}
            state = (nxt, new_boxes)
            if state not in seen:
                seen.add(state)
                queue.append((state, dist + 1))
        if len(seen) > limit:
            raise AssertionError("BFS limit reached")
    return None


def test_is_an_env() -> None:
    assert isinstance(SokobanEnv(), Env)


def test_push_onto_target_wins_with_documented_reward() -> None:
    env = make("#####\n#PXO#\n#####")
    result = env.step("Right")
    assert result.observation == "#####\n#_P√#\n#####"
    assert result.reward == pytest.approx(-0.1 + 1.0 + 10.0)
    assert result.terminated and not result.truncated
    assert result.info["success"] and result.info["boxes_on_target"] == 1
    with pytest.raises(EnvError):
        env.step("Left")


def test_walls_and_box_into_box_are_blocked() -> None:
    env = make("#######\n#PXX_O#\n#____O#\n#######")
    before = env.render()
    up = env.step("Up")
    assert up.observation == before and up.reward == pytest.approx(-0.1)
    assert up.info["action_is_valid"] and not up.info["action_is_effective"]
    right = env.step("right")
    assert right.observation == before, "a box cannot push another box"
    down = env.step(" DOWN ")
    assert down.observation == "#######\n#_XX_O#\n#P___O#\n#######"


def test_box_off_target_costs_and_back_on_pays() -> None:
    env = make("########\n#P√_O_X#\n########")
    off = env.step("Right")
    assert off.reward == pytest.approx(-0.1 - 1.0)
    assert off.observation == "########\n#_SXO_X#\n########"
    on = env.step("Right")
    assert on.reward == pytest.approx(-0.1 + 1.0)
    assert on.observation == "########\n#_OP√_X#\n########"
    assert not on.terminated


def test_render_symbols_exact() -> None:
    env = make("#####\n#PO_#\n#X__#\n#####")
    assert env.render() == "#####\n#PO_#\n#X__#\n#####"
    assert env.step("Right").observation == "#####\n#_S_#\n#X__#\n#####"


def test_invalid_word_is_a_noop_and_truncation() -> None:
    env = make("#####\n#P_O#\n#X__#\n#####", max_steps=2)
    first = env.step("jump")
    assert not first.info["action_is_valid"] and first.reward == pytest.approx(-0.1)
    assert not first.done
    second = env.step("Right")
    assert second.truncated and not second.terminated


@pytest.mark.parametrize("boxes", [1, 2])
def test_generated_levels_are_solvable_and_unsolved(boxes: int) -> None:
    env = SokobanEnv(SokobanConfig(width=6, height=6, num_boxes=boxes))
    for seed in range(15):
        env.reset(seed=seed)
        assert env.level is not None
        assert not (env.level.boxes & env.level.targets), "no box starts on a target"
        assert len(env.level.boxes) == boxes
        moves = solve(env.level)
        assert moves is not None and moves > 0, f"seed {seed} unsolvable:\n{env.render()}"


def test_generation_is_deterministic_by_seed() -> None:
    a, b = SokobanEnv(), SokobanEnv()
    assert a.reset(seed=7)[0] == b.reset(seed=7)[0]
    assert len({a.reset(seed=s)[0] for s in range(8)}) > 1
    seeded_a, seeded_b = SokobanEnv(SokobanConfig(seed=3)), SokobanEnv(SokobanConfig(seed=3))
    assert [seeded_a.reset()[0] for _ in range(3)] == [seeded_b.reset()[0] for _ in range(3)]


def test_rgb_render() -> None:
    env = make("#####\n#PXO#\n#####", tile_size=4)
    frame = env.render("rgb_array")
    assert isinstance(frame, np.ndarray)
    assert frame.shape == (12, 20, 3) and frame.dtype == np.uint8
    assert not np.array_equal(frame[4:8, 4:8], frame[4:8, 8:12]), "player and box tiles differ"
    assert render_rgb(env.level, 3).shape == (9, 15, 3)  # type: ignore[arg-type]
    with pytest.raises(EnvError):
        env.render("ansi")  # type: ignore[arg-type]


def test_bad_levels_and_configs_are_rejected() -> None:
    with pytest.raises(EnvError, match="one player"):
        SokobanLevel.from_text("####\n#XO#\n####")
    with pytest.raises(EnvError, match="unknown Sokoban symbol"):
        SokobanLevel.from_text("####\n#PZ#\n####")
    with pytest.raises(ValidationError, match="too few"):
        SokobanConfig(width=4, height=4, num_boxes=2)
    with pytest.raises(EnvError, match="reset"):
        SokobanEnv().step("Up")


def test_expert_solves_generated_levels_in_the_fewest_moves_even_after_a_detour() -> None:
    """``expert: true``: following ``info['expert_action']`` from reset solves each level in exactly the test's
    BFS shortest length, and from the state after two random moves it still solves it (when still solvable)."""
    for seed in range(6):
        env = SokobanEnv(SokobanConfig(height=6, width=6, num_boxes=1, max_steps=60, expert=True))
        _, info = env.reset(seed=seed)
        shortest = solve(env.level)
        moves = 0
        while not env.level.solved:
            info = env.step(info["expert_action"]).info
            moves += 1
        assert moves == shortest and "expert_action" not in info  # no advice on a finished episode
        _, info = env.reset(seed=seed)
        for action in ("Left", "Up"):
            info = env.step(action).info
        if solve(env.level) is None:
            assert info["expert_action"] is None
            continue
        while not env.level.solved:
            info = env.step(info["expert_action"]).info
    assert "expert_action" not in SokobanEnv(SokobanConfig(height=6, width=6)).reset(seed=0)[1]
