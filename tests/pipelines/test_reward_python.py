"""Rewards as plain Python functions (``type: python``) and the built-in ``exact_match`` reward.

Every check is a unit test (milliseconds): functions are real modules and real files this test writes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from roll.core import plugins
from roll.core.cli import load_run_config
from roll.core.errors import ConfigError
from roll.pipelines.rewards.check import reward_issues
from roll.pipelines.rewards.exact import ExactMatchConfig, ExactMatchReward
from roll.pipelines.rewards.python import PythonReward, PythonRewardConfig
from roll.pipelines.rewards.types import RewardRequest
from roll.pipelines.rlvr.config import RewardDomainConfig

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = "roll.pipelines.rewards.exact:exact_match"


def test_module_function_scores_rows() -> None:
    """exact_match normalizes whitespace, case and a trailing period: ' Paris. ' == 'paris'."""
    reward = PythonReward(PythonRewardConfig(function=BUILTIN))
    results = reward.score([RewardRequest(" Paris. ", ground_truth="paris"), RewardRequest("Lyon", "paris")])
    assert [r.score for r in results] == [1.0, 0.0]
    assert results[0].info == {"correct": True}


def test_file_function_gets_the_keywords_it_declares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """score = len(prompt) + bonus, so 'abc' with bonus 0.5 gives 3.5; the dict's other keys become info."""
    (tmp_path / "my_rewards.py").write_text(
        "def by_prompt(response, ground_truth, *, prompt, bonus=0.0):\n"
        "    return {'score': len(prompt) + bonus, 'seen': response}\n"
    )
    monkeypatch.chdir(tmp_path)
    config = PythonRewardConfig(function="my_rewards.py:by_prompt", kwargs={"bonus": 0.5})
    assert config.function == f"{tmp_path / 'my_rewards.py'}:by_prompt"  # stored absolute for the workers
    (result,) = PythonReward(config).score([RewardRequest("r", prompt="abc", tag="t")])
    assert result.score == 3.5 and result.info == {"seen": "r"}


def test_batched_function_and_bad_returns(tmp_path: Path) -> None:
    """Batched: one call with lists; a non-numeric value or an exception scores 0 with the reason."""
    file = tmp_path / "batch.py"
    file.write_text(
        "def lengths(responses, ground_truths, **kw):\n"
        "    return [len(r) if r != 'bad' else 'oops' for r in responses]\n"
        "def boom(response, ground_truth):\n"
        "    raise KeyError('x')\n"
    )
    batched = PythonReward(PythonRewardConfig(function=f"{file}:lengths", batched=True))
    results = batched.score([RewardRequest("ab"), RewardRequest("bad")])
    assert results[0].score == 2.0
    assert results[1].score == 0.0 and "returned str" in results[1].info["error"]
    (boom,) = PythonReward(PythonRewardConfig(function=f"{file}:boom")).score([RewardRequest("a")])
    assert boom.score == 0.0 and "raised KeyError" in boom.info["error"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(response):\n    return 1\n", "fewer than two positional"),
        ("def f(response, ground_truth, scale):\n    return 1\n", "['scale'] have no default"),
        ("x = 3\n", "no attribute 'f'"),
        ("raise RuntimeError('at import')\n", "importing"),
    ],
)
def test_signature_is_checked_when_the_config_loads(tmp_path: Path, source: str, expected: str) -> None:
    file = tmp_path / "r.py"
    file.write_text(source)
    issues = reward_issues(
        {"custom": RewardDomainConfig(type="python", tags=["t"], options={"function": f"{file}:f"})}
    )
    assert [i.path for i in issues] == ["rewards.custom.options.function"]
    assert expected in issues[0].message


def test_unknown_module_and_plugin_name_are_reported() -> None:
    domains = {
        "a": RewardDomainConfig(type="python", tags=["a"], options={"function": "no_such_pkg.rewards:f"}),
        "b": RewardDomainConfig(type="pythn", tags=["b"]),
    }
    issues = {i.path: i.message for i in reward_issues(domains)}
    assert "cannot import module 'no_such_pkg.rewards'" in issues["rewards.a.options.function"]
    assert "no roll.reward plugin named 'pythn'" in issues["rewards.b.type"]


def test_validate_reports_a_bad_function_with_key_path_and_line(tmp_path: Path) -> None:
    """The quickstart with its reward swapped for a function taking one argument fails at load time."""
    data = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    (tmp_path / "r.py").write_text("def one(response):\n    return 0.0\n")
    data["rewards"]["arithmetic"] = {
        "type": "python",
        "tags": ["arithmetic"],
        "options": {"function": f"{tmp_path}/r.py:one"},
    }
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    load_run_config(cfg, [])  # the config model alone cannot see it
    with pytest.raises(ConfigError) as err:
        load_run_config(cfg, [], preflight=True)
    (issue,) = err.value.issues
    assert issue.path == "rewards.arithmetic.options.function"
    assert issue.source is not None and issue.source.startswith(f"{cfg}:")
    assert "fewer than two positional" in str(err.value)


def test_exact_match_reward_with_pattern() -> None:
    """The last 'answer is X' wins: 'answer is 3 ... answer is 4' extracts '4'."""
    reward = ExactMatchReward(ExactMatchConfig(pattern=r"answer is (\w+)"))
    results = reward.score(
        [
            RewardRequest("the answer is 3, no, the answer is 4.", ground_truth="4"),
            RewardRequest("the answer is 3.", ground_truth="4"),
            RewardRequest("no idea", ground_truth="4"),
        ]
    )
    assert [r.score for r in results] == [1.0, 0.0, 0.0]
    assert results[0].info["answer"] == "4" and results[2].info["error"] == "no answer found"
    with pytest.raises(ValueError, match="not a valid regular expression"):
        ExactMatchConfig(pattern="(")


def test_plugins_are_registered() -> None:
    assert plugins.available("roll.reward")["python"].dist == "roll-pipelines"
    assert plugins.load("roll.reward", "exact_match").config_model is ExactMatchConfig
