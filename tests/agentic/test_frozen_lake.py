"""FrozenLake: holes end the episode with 0, the goal pays 1, generated maps always have a path."""

from __future__ import annotations

import random

import pytest

from roll.agentic.envs.frozen_lake import FrozenLakeConfig, FrozenLakeEnv, generate_map, has_path
from roll.agentic.types import EXPERT_ACTION, Env, EnvError

MAP = ["S_O", "___", "O_G"]


def make(**kw: object) -> FrozenLakeEnv:
    env = FrozenLakeEnv(FrozenLakeConfig(**kw), rows=MAP)
    env.reset(seed=0)
    return env


def test_is_an_env() -> None:
    assert isinstance(FrozenLakeEnv(), Env)


def test_hole_ends_with_zero() -> None:
    env = make()
    assert env.render() == "P_O\n___\nO_G"
    assert env.step("Right").reward == 0.0
    result = env.step("Right")
    assert result.terminated and not result.truncated and result.reward == 0.0
    assert result.info["fell"] and result.observation == "__X\n___\nO_G"
    with pytest.raises(EnvError):
        env.step("Left")


def test_goal_pays_one() -> None:
    env = make()
    rewards = [env.step(a).reward for a in ("Right", "Down", "Down")]
    result = env.step("right")
    assert rewards == [0.0, 0.0, 0.0]
    assert result.reward == 1.0 and result.terminated and result.info["success"]
    assert result.observation == "__O\n___\nO_√"


def test_border_truncation_and_invalid_action() -> None:
    env = make(max_steps=2)
    up = env.step("Up")
    assert env.player == (0, 0) and not up.done
    bad = env.step("fly")
    assert not bad.info["action_is_valid"] and bad.truncated and not bad.terminated


def test_slippery_moves_sideways() -> None:
    env = make(slippery=True, slip_prob=1.0)
    env.step("Right")
    assert env.player in {(0, 0), (1, 0)}, "Right slips to Up (blocked) or Down"


def test_generated_maps_have_a_path_and_are_seeded() -> None:
    for seed in range(30):
        rows = generate_map(6, 0.6, random.Random(seed))
        assert rows[0][0] == "S" and rows[-1][-1] == "G" and has_path(rows)
    assert not has_path(["SO", "OG"])
    a, b = FrozenLakeEnv(), FrozenLakeEnv()
    assert a.reset(seed=5)[0] == b.reset(seed=5)[0]


def test_bad_map_rejected() -> None:
    with pytest.raises(EnvError):
        FrozenLakeEnv(rows=["__", "_G"])


def test_expert_action_walks_a_shortest_path_to_the_goal() -> None:
    """Following ``info['expert_action']`` wins every generated map in exactly the BFS distance."""
    for seed in range(30):
        env = FrozenLakeEnv(FrozenLakeConfig(size=5, frozen_prob=0.7, max_steps=40))
        _, info = env.reset(seed=seed)
        moves = 0
        while True:
            result = env.step(info[EXPERT_ACTION])
            moves += 1
            info = result.info
            if result.done:
                break
        assert result.info["success"] and not result.info["fell"]
        assert EXPERT_ACTION not in result.info, "no expert action after the episode ended"
        assert moves == _bfs_distance(env.rows)


def test_expert_action_is_none_without_a_path() -> None:
    env = FrozenLakeEnv(rows=["SO", "OG"])
    assert env.reset(seed=0)[1][EXPERT_ACTION] is None


def _bfs_distance(rows: list[str]) -> int:
    dist, frontier = 0, {(0, 0)}
    seen = set(frontier)
    while frontier:
        if any(rows[r][c] == "G" for r, c in frontier):
            return dist
        nxt = set()
        for r, c in frontier:
            for dr, dc in ((0, 1), (1, 0), (0, -1), (-1, 0)):
                cell = (r + dr, c + dc)
                if 0 <= cell[0] < len(rows) and 0 <= cell[1] < len(rows[0]) and rows[cell[0]][cell[1]] != "O":
                    nxt.add(cell)
        frontier = nxt - seen
        seen |= frontier
        dist += 1
    raise AssertionError("no path")
