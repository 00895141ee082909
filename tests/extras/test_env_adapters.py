"""The ``gem`` and ``gymnasium`` env adapters (extras ``roll-agentic[gem|gymnasium]``) against the real libraries:
the adapter's observations, rewards, flags and info equal the library's own for the same seed and actions, and
roll's additions (text observations, named actions, ``max_steps``, ``success``) behave as documented.

In ``tests/extras``: the per-package CI installs roll-agentic without its extras. Unit-speed (gem's import, about
5 s, dominates).
"""

from __future__ import annotations

import re
from pathlib import Path

import gem
import gymnasium
import pytest

from roll.agentic.env_manager.config import EnvEntryConfig
from roll.agentic.env_manager.slots import build_env, valid_actions_of
from roll.agentic.envs.gem_adapter import GemEnv, GemEnvConfig
from roll.agentic.envs.gymnasium_adapter import GymnasiumEnv, GymnasiumEnvConfig, ansi_to_text
from roll.agentic.types import EnvError
from roll.core import plugins

LAKE = {"env_id": "FrozenLake-v1", "env_kwargs": {"render_mode": "ansi", "is_slippery": False}}
NAMES = ["Left", "Down", "Right", "Up"]  # FrozenLake's Discrete(4) order


def test_plugins_are_registered_with_their_distribution() -> None:
    infos = plugins.available("roll.env")
    assert infos["gem"].dist == infos["gymnasium"].dist == "roll-agentic"


def test_frozen_lake_text_named_actions_and_a_win() -> None:
    """Default 4x4 map SFFF/FHFH/FFFH/HFFG: Down Down Right Right Down Right reaches G (reward 1)."""
    env = build_env(EnvEntryConfig(type="gymnasium", options={**LAKE, "action_names": NAMES}))
    assert valid_actions_of(env) == tuple(NAMES)
    assert env.system_prompt.endswith(
        "Valid actions: Left, Down, Right, Up. Answer with one action, e.g. <answer>Left</answer>."
    )
    text, info = env.reset(seed=0)
    assert text == "[S]FFF\nFHFH\nFFFH\nHFFG" and info == {"prob": 1}
    for action in ["Down", "Down", "Right", "Right", "Down"]:
        result = env.step(action)
        assert (result.reward, result.terminated, result.truncated) == (0.0, False, False)
    assert result.observation.endswith("HF[F]G")
    win = env.step("Right")
    assert (win.reward, win.terminated, win.truncated, win.info["success"]) == (1.0, True, False, True)
    with pytest.raises(EnvError, match="finished"):
        env.step("Left")


def test_hole_invalid_action_and_both_truncations() -> None:
    env = GymnasiumEnv(GymnasiumEnvConfig(**LAKE, action_names=NAMES, max_steps=2))
    env.reset(seed=0)
    start = env.render()
    bad = env.step("Jump")  # parses to no action: the env does not move
    assert bad.observation == start and bad.info["format_ok"] is False and not bad.done
    cut = env.step("Left")  # roll's max_steps=2 reached without the episode ending
    assert (cut.terminated, cut.truncated) == (False, True)
    env.reset(seed=0)
    env.step("Right")
    hole = env.step("Down")  # (1, 1) is a hole
    assert (hole.reward, hole.terminated, hole.info["success"]) == (0.0, True, False)
    timed = GymnasiumEnv(
        GymnasiumEnvConfig(
            **{**LAKE, "env_kwargs": {**LAKE["env_kwargs"], "max_episode_steps": 1}}, action_names=NAMES
        )
    )
    timed.reset(seed=0)
    assert timed.step("Left").truncated is True  # gymnasium's own TimeLimit, passed through


def test_slippery_lake_matches_gymnasium_step_for_step(tmp_path: Path) -> None:
    """Same seed, same actions: the adapter's rewards, flags and info are gymnasium's; ``render`` sees the raw
    observation (an int on FrozenLake)."""
    (tmp_path / "lake_text.py").write_text(
        "def render(observation, info, env):\n    return f'cell {observation}'\n"
    )
    env = GymnasiumEnv(
        GymnasiumEnvConfig(
            env_id="FrozenLake-v1", render=f"{tmp_path}/lake_text.py:render", action_names=NAMES
        )
    )
    raw = gymnasium.make("FrozenLake-v1")
    text, _ = env.reset(seed=7)
    obs, _ = raw.reset(seed=7)
    assert text == f"cell {obs}"
    for action in [1, 2, 2, 1, 1, 2, 0, 3] * 3:
        mine = env.step(NAMES[action])
        obs, reward, terminated, truncated, info = raw.step(action)
        assert (mine.observation, mine.reward, mine.terminated, mine.truncated) == (
            f"cell {obs}",
            reward,
            terminated,
            truncated,
        )
        assert mine.info == {**info, "success": terminated and reward >= 1.0}
        if mine.done:
            break


def test_user_parse_for_cartpole_and_box_spaces_need_one(tmp_path: Path) -> None:
    (tmp_path / "cart.py").write_text(
        "def parse(text, env):\n    return {'push left': 0, 'push right': 1}.get(text.strip().lower())\n"
    )
    env = GymnasiumEnv(GymnasiumEnvConfig(env_id="CartPole-v1", parse=f"{tmp_path}/cart.py:parse"))
    text, _ = env.reset(seed=0)
    assert text.startswith("[") and len(re.findall(r"-?\d\.\d+", text)) == 4  # str of the 4-float state
    assert env.step("Push right").reward == 1.0 and env.step("fly").info["invalid_action"]
    with pytest.raises(EnvError, match="Box action space: set `parse:`"):
        GymnasiumEnv(GymnasiumEnvConfig(env_id="Pendulum-v1"))
    with pytest.raises(ValueError, match="does not exist"):
        GymnasiumEnvConfig(env_id="CartPole-v1", parse="no/such/file.py:parse")


def test_ansi_to_text() -> None:
    assert ansi_to_text("  (Down)\nS\x1b[41mF\x1b[0mF\n\x1b[1mG") == "  (Down)\nS[F]F\nG"


def guess(observation: str, low: int, high: int) -> tuple[int, int]:
    """Narrow [low, high] by GEM's hint 'the target number is higher/lower than N'."""
    hint = re.search(r"target number is (higher|lower) than (\d+)", observation)
    if hint:
        n = int(hint.group(2))
        low, high = (n + 1, high) if hint.group(1) == "higher" else (low, n - 1)
    return low, high


def test_gem_guess_the_number_matches_gem_and_wins() -> None:
    """Binary search on 1..10 wins within GEM's 4 turns; every step equals the raw GEM env's for the same seed."""
    env = build_env(EnvEntryConfig(type="gem", options={"env_id": "game:GuessTheNumber-v0-easy"}))
    raw = gem.make("game:GuessTheNumber-v0-easy")
    text, info = env.reset(seed=3)
    raw_text, raw_info = raw.reset(seed=3)
    assert (text, info) == (raw_text, raw_info) and valid_actions_of(env) is None  # raw text goes to GEM
    low, high = 1, 10
    while True:
        action = f"My guess: \\boxed{{{(low + high) // 2}}}"
        mine = env.step(action)
        theirs = raw.step(action)
        assert (mine.observation, mine.reward, mine.terminated, mine.truncated) == theirs[:4]
        assert {k: v for k, v in mine.info.items() if k != "success"} == theirs[4]
        if mine.done:
            break
        low, high = guess(mine.observation, low, high)
    assert mine.info["success"] is True and mine.reward == 1.0 and "Congratulations" in mine.observation


def test_gem_format_error_roll_truncation_and_unknown_id() -> None:
    env = GemEnv(GemEnvConfig(env_id="game:GuessTheNumber-v0-easy", max_steps=1))
    env.reset(seed=3)
    wrong = env.step("\\boxed{1}" if env.env.game_number != 1 else "\\boxed{2}")
    assert (wrong.terminated, wrong.truncated, wrong.info["success"]) == (False, True, False)
    env.reset(seed=3)
    no_box = env.step("five")  # GEM ends the episode on a format error, with its own penalty
    assert no_box.terminated and no_box.reward < 0 and not no_box.info["success"]
    with pytest.raises(EnvError, match="not found in registry"):
        GemEnv(GemEnvConfig(env_id="game:NoSuchGame-v0"))


def test_gem_python_tool() -> None:
    """With tools: [python], code in <python> tags runs through GEM's tool wrapper; the game goes on."""
    env = GemEnv(GemEnvConfig(env_id="game:GuessTheNumber-v0-easy", tools=["python"]))
    text, _ = env.reset(seed=3)
    assert "<python>" in text  # GEM's tool instructions are appended to the first observation
    tool = env.step("<python>print(6 * 7)</python>")
    assert "42" in tool.observation and not tool.done
    answer = env.step(f"\\boxed{{{env.env.unwrapped.game_number}}}")
    assert answer.terminated and answer.info["success"]


def test_gem_named_answers_go_to_gem_in_its_format() -> None:
    """``answers`` 1..10 with ``answer_format`` ``\\boxed{N}``: the env lists them as valid actions (so the env
    manager parses ``<answer>N</answer>``), the named answer reaches GEM boxed, and other text reaches GEM as is."""
    options = {
        "env_id": "game:GuessTheNumber-v0-easy",
        "env_kwargs": {"max_turns": 1},
        "answers": [str(n) for n in range(1, 11)],
        "answer_format": "\\boxed{{{answer}}}",
    }
    env = build_env(EnvEntryConfig(type="gem", options=options))
    assert valid_actions_of(env) == tuple(options["answers"])
    assert env.system_prompt.endswith(
        "Valid actions: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10. Answer with one, e.g. <answer>1</answer>."
    )
    env.reset(seed=3)
    target = env.env.unwrapped.game_number
    guess_ = 1 if target != 1 else 2
    one_turn = env.step(str(guess_))  # GEM's last-turn reward: 1 - |guess - target| / 9
    assert one_turn.reward == pytest.approx(1 - abs(guess_ - target) / 9) and one_turn.terminated
    env.reset(seed=3)
    assert env.step(str(target)).info["success"] is True
    env.reset(seed=3)
    assert env.step("five").reward < 0  # GEM's own format penalty
    with pytest.raises(ValueError, match="must contain"):
        GemEnvConfig(env_id="game:GuessTheNumber-v0-easy", answers=["1", "2"], answer_format="\\boxed{}")
