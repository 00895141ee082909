"""Rewards as plain Python functions (``type: python``) and the built-in ``exact_match`` reward.

Every check is a unit test (milliseconds): functions are real modules and real files this test writes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from roll.core import plugins
from roll.core.cli import load_run_config
from roll.core.errors import ConfigError
from roll.pipelines.rewards._isolated import IsolatedFunction, RemoteTraceback
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
    assert results[1].score == 0.0 and "returned 'oops' (str)" in results[1].info["error"]
    assert results[1].is_unscored and not results[0].is_unscored
    (boom,) = PythonReward(PythonRewardConfig(function=f"{file}:boom")).score([RewardRequest("a")])
    assert (
        boom.score == 0.0 and "raised KeyError" in boom.info["error"] and boom.info["unscored"] == "KeyError"
    )


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


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (float("nan"), "returned nan (float)"),
        (float("-inf"), "returned -inf (float)"),
        (None, "returned None (NoneType)"),
        (1e300, "returned 1e+300 (float)"),  # finite, but inf once it is a float32 score
        ("0.5", "returned '0.5' (str)"),
        ({"score": float("inf"), "x": 1}, "returned 'score' inf (float)"),
        ({"points": 1.0}, "returned {'points': 1.0} (dict)"),
    ],
)
def test_a_value_that_is_not_a_finite_number_is_an_error_naming_it(value: object, shown: str) -> None:
    from roll.pipelines.rewards.python import to_result

    result = to_result(value, "my_rewards.py:f")
    assert result.score == 0.0 and result.is_unscored and result.info["unscored"] == "invalid value"
    assert result.info["error"].startswith(f"my_rewards.py:f {shown}; a reward must be a finite number")
    assert not to_result(2, "f").is_unscored and to_result(True, "f").info == {"correct": True}


def _worker(tmp_path: Path, source: str, name: str = "f") -> object:
    """A RewardWorker built as Ray would build it (without Ray), for domain ``custom`` and a file function."""
    from roll.core.cluster import WorkerContext
    from roll.pipelines.rlvr.reward_worker import RewardWorker

    file = tmp_path / "my_rewards.py"
    file.write_text(source)
    worker = RewardWorker.__new__(RewardWorker)
    RewardWorker.__init__(
        worker, WorkerContext("reward_custom", 0, 1), "python", {"function": f"{file}:{name}"}
    )
    return worker


ROWS = {
    "text": ["7", "8"],
    "prompt": ["What is 3 + 4?", "What is 4 + 4?"],
    "ground_truth": ["7", "8"],
    "tag": ["", ""],
}


def test_worker_reports_a_nan_reward_naming_reward_row_and_value(tmp_path: Path) -> None:
    worker = _worker(
        tmp_path, "def f(response, ground_truth):\n    return float('nan') if response == '8' else 1.0\n"
    )
    out = worker.score(ROWS)  # type: ignore[attr-defined]
    assert out["scores_B"] == [1.0, 0.0] and out["reward_error_B"] == [0.0, 1.0]
    first, second = out["reward_error_report"]
    assert first is None and second.source == "reward custom (python)" and second.kind == "invalid value"
    assert "my_rewards.py:f returned nan (float)" in second.message
    assert "prompt 'What is 4 + 4?', response '8', ground truth '8'" in second.message


def test_worker_sends_a_raising_rewards_traceback_once_and_marks_every_row(tmp_path: Path) -> None:
    source = (
        "def helper(x):\n    return {}[x]\n\ndef f(response, ground_truth):\n    return helper(response)\n"
    )
    worker = _worker(tmp_path, source)
    reports = worker.score(ROWS)["reward_error_report"] + worker.score(ROWS)["reward_error_report"]  # type: ignore[attr-defined]
    assert [r.kind for r in reports] == ["KeyError"] * 4
    assert reports[0].traceback is not None and "in helper" in reports[0].traceback
    assert [r.traceback for r in reports[1:]] == [None, None, None]
    assert "my_rewards.py:f raised KeyError: '7'" in reports[0].message


def test_a_plugin_whose_score_raises_leaves_its_rows_unscored() -> None:
    from roll.pipelines.rewards.types import RewardRequest, RewardResult
    from roll.pipelines.rlvr.reward_worker import checked_results

    class Broken:
        def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
            raise RuntimeError("verifier crashed")

    class Short:
        def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
            return [RewardResult(float("inf"))]

    results = checked_results(Broken(), [RewardRequest("a"), RewardRequest("b")], "reward x")
    assert all(
        r.is_unscored and "reward x raised RuntimeError: verifier crashed" in r.info["error"] for r in results
    )
    assert "Traceback" in results[0].info["traceback"]
    (inf,) = checked_results(Short(), [RewardRequest("a")], "reward y")
    assert "reward y returned inf (float)" in inf.info["error"]
    assert (
        "2 rows" in checked_results(Short(), [RewardRequest("a"), RewardRequest("b")], "r")[0].info["error"]
    )


HANGING = """
import os, signal, time

def spin(response, ground_truth):
    if response == "spin":
        while True:
            pass
    if response == "sleep":
        time.sleep(1e9)
    if response == "deaf":  # ignores every signal it can, then spins
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        while True:
            pass
    if response == "exit":
        os._exit(3)
    if response == "pid":
        return float(os.getpid())
    return float(len(response))
"""


def test_a_row_that_never_returns_fails_at_its_deadline_and_the_next_row_scores(tmp_path: Path) -> None:
    """timeout_s=1: each of `while True: pass`, `time.sleep(1e9)`, a spin that ignores SIGTERM/SIGINT/SIGALRM/
    SIGHUP, and `os._exit(3)` fails its row (score 0, the reason in info["error"]) within a few seconds, and the
    row after each scores len(response) in a fresh process. Golden: "ok" -> 2.0, "okay" -> 4.0."""
    file = tmp_path / "hang.py"
    file.write_text(HANGING)
    reward = PythonReward(PythonRewardConfig(function=f"{file}:spin", timeout_s=1.0))
    (first_pid,) = reward.score([RewardRequest("pid")])
    for bad in ("spin", "sleep", "deaf"):
        started = time.monotonic()
        late, ok = reward.score([RewardRequest(bad), RewardRequest("okay")])
        assert 1.0 <= time.monotonic() - started < 30
        assert late.score == 0.0 and "did not return within timeout_s=1s" in late.info["error"], late
        assert ok.score == 4.0 and "error" not in ok.info
    dead, ok = reward.score([RewardRequest("exit"), RewardRequest("ok")])
    assert "died during the call (exit code 3)" in dead.info["error"] and ok.score == 2.0
    (pid,) = reward.score([RewardRequest("pid")])
    assert pid.score not in (first_pid.score, float(os.getpid()))  # a fresh child, never the caller's process
    assert reward._call.killed == 3  # type: ignore[attr-defined]  # the three late calls; the exit was not late


def test_an_isolated_exception_keeps_its_type_and_the_child_traceback(tmp_path: Path) -> None:
    """A KeyError raised in the child is raised again as a KeyError whose cause holds the child's traceback,
    naming the user's file and line; a class that exists only in the user's file comes back as itself too."""
    file = tmp_path / "raises.py"
    file.write_text(
        "class Custom(Exception):\n    pass\n"
        "def key(response, ground_truth):\n    raise KeyError(response)\n"
        "def custom(response, ground_truth):\n    raise Custom('mine')\n"
    )
    call = IsolatedFunction(f"{file}:key", timeout_s=10.0)
    with pytest.raises(KeyError) as info:
        call("x", "")
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert f'File "{file}", line 4, in key' in info.value.__cause__.text
    call.close()
    (result,) = PythonReward(PythonRewardConfig(function=f"{file}:custom")).score([RewardRequest("a")])
    assert "raised Custom: mine" in result.info["error"]
    trace = result.info["traceback"]  # the child's traceback alone: the user's frame, one header
    assert f'File "{file}", line 6, in custom' in trace and trace.count("Traceback (most recent") == 1


def test_timeout_null_calls_the_function_in_the_workers_process(tmp_path: Path) -> None:
    file = tmp_path / "hang.py"
    file.write_text(HANGING)
    (result,) = PythonReward(PythonRewardConfig(function=f"{file}:spin", timeout_s=None)).score(
        [RewardRequest("pid")]
    )
    assert result.score == float(os.getpid())
