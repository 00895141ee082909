"""The terminal env and its bash tool, against an agent that tries to win without doing the task.

Every attack runs for real: a jail of the code sandbox per episode, bash as the sandbox uid (CI runs as root), the
checker in a fresh process after the episode. An attack passes when the checker's verdict stays what the honest
final state deserves and the host is untouched.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path

import pytest

from roll.agentic.envs.terminal import TerminalConfig, TerminalEnv
from roll.agentic.envs.terminal_tasks import (
    STATE_CHECKER,
    FilesTaskConfig,
    TerminalTask,
    expected_state,
    generate_files_task,
    load_tasks,
)
from roll.agentic.tools.bash import ShellLimits, Workspace
from roll.agentic.tools.registry import build_tools
from roll.core.errors import ConfigError

# The learning check's asserted rise (last three RL steps over the first two): +0.11, +0.27, +0.15 measured (seeds 0-2)
MARGIN = 0.05
LIMITS = ShellLimits(timeout_s=2.0, cpu_time_s=2, disk_mb=8, file_size_mb=2, max_output_bytes=4000)


def _env(tmp_path: Path, task: TerminalTask, max_steps: int = 6) -> TerminalEnv:
    path = tmp_path / "tasks.jsonl"
    path.write_text(task.model_dump_json() + "\n")
    return TerminalEnv(
        TerminalConfig(tasks_path=str(path), max_steps=max_steps, limits=LIMITS, checker_timeout_s=5)
    )


def _play(env: TerminalEnv, commands: list[str]) -> tuple[list[str], float, dict[str, object]]:
    """Run ``commands`` (then submit): the observations, the final reward and info."""
    env.reset(seed=0)
    seen = []
    for command in commands:
        result = env.step(f"<answer>{command}</answer>")
        seen.append(str(result.observation))
        assert not result.done
    final = env.step("<answer>submit</answer>")
    assert final.done
    return seen, final.reward, final.info


def _secret_task() -> tuple[TerminalTask, str]:
    """Solved when out.txt holds a secret the agent is never told: only a leak could solve it."""
    secret = secrets.token_hex(16)
    checker = 'grep -q "$SECRET" out.txt  # checker-marker-7f3a\n'
    return TerminalTask(instruction="Guess.", checker=checker, expected={"SECRET": secret}), secret


# ---------------------------------------------------------------------------------------------- it works


@pytest.mark.parametrize("kind", ["delete", "find", "fix", "sort"])
def test_generated_tasks_accept_their_solution_only(kind: str) -> None:
    env = TerminalEnv(TerminalConfig(generated=FilesTaskConfig(kinds=[kind]), limits=LIMITS, max_steps=2))
    for seed in range(2):
        _, info = env.reset(seed)
        solution = str(info["expert_action"])
        assert env.step(f"<answer>{solution}</answer>").reward == 0.0
        solved = env.step("<answer>submit</answer>")
        assert solved.reward == 1.0 and solved.info["success"] is True, solved.info
        env.reset(seed)
        wrong = next(c for c in env.task.commands or [] if c != solution)  # type: ignore[union-attr]
        env.step(f"<answer>{wrong}</answer>")
        assert env.step("<answer>submit</answer>").reward == 0.0
    env.close()


def test_generated_family_is_seeded_and_states_its_vocabulary() -> None:
    config = FilesTaskConfig(kinds=["delete", "find"], num_files=3)
    assert generate_files_task(config, 5) == generate_files_task(config, 5)
    assert len({generate_files_task(config, s).instruction for s in range(20)}) > 5
    env = TerminalEnv(TerminalConfig(generated=config))
    env.reset(1)
    assert env.action_space_text == "Valid actions: rm a.txt, rm b.txt, rm c.txt, submit"


def test_one_step_episode_runs_the_checker_after_the_step_limit() -> None:
    """With max_steps=1 (the learning setup) the bare command the env manager parsed is run, then checked."""
    env = TerminalEnv(TerminalConfig(generated=FilesTaskConfig(kinds=["delete"]), limits=LIMITS, max_steps=1))
    _, info = env.reset(3)
    result = env.step(str(info["expert_action"]))
    assert result.terminated and result.reward == 1.0 and result.info["ended_by"] == "step_limit"


def test_files_persist_across_calls_processes_do_not_and_the_jail_is_destroyed_after() -> None:
    ws = Workspace(LIMITS)
    assert ws.run("echo one > keep.txt; sleep 30 & echo started").output == "started\n"
    later = ws.run("cat keep.txt; ps -e -o comm= | grep -c sleep; id -u")
    assert later.output.split() == ["one", "0", "65534" if os.geteuid() == 0 else str(os.geteuid())]
    jail = ws._jail
    assert jail is not None
    ws.close()
    assert jail.proc.poll() is not None and not jail.workdir.exists()


def test_tool_call_format_and_the_bash_tool_alone(tmp_path: Path) -> None:
    env = _env(tmp_path, TerminalTask(instruction="Make done.txt.", checker="test -f done.txt"))
    env.reset(0)
    call = json.dumps({"name": "bash", "arguments": {"command": "touch done.txt && echo ok"}})
    assert "<tool_response>\nok\n</tool_response>" in str(
        env.step(f"<tool_call>{call}</tool_call>").observation
    )
    assert env.step("<answer>submit</answer>").reward == 1.0
    (tool,) = build_tools("bash", {"limits": LIMITS.model_dump()})
    try:
        assert tool.call({"command": "echo hi > f; cat f"}).text == "hi"
        assert tool.call({"command": "cat f"}).text == "hi"
        assert not tool.call({}).ok
    finally:
        tool.close()


def test_tasks_file_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    good = TerminalTask(instruction="x", checker="true").model_dump_json()
    path.write_text(good + "\n" + json.dumps({"instruction": "y"}) + "\n")
    with pytest.raises(ConfigError, match="line 2"):
        load_tasks(str(path))
    with pytest.raises(ValueError, match="checker_timeout_s"):
        TerminalConfig(checker_timeout_s=1, limits=ShellLimits(timeout_s=5))


# ---------------------------------------------------------------------------------------------- attacks


def test_agent_cannot_find_the_checker_or_its_expected_values(tmp_path: Path) -> None:
    """The scans search for the secret and the checker's text themselves (a stand-in for any search the agent
    could make): nowhere in the jail's writable or private parts, nor in any process's memory views. /usr and the
    interpreter's prefix are the host's, read-only, and hold neither."""
    task, secret = _secret_task()
    top = Path(os.path.realpath(sys.executable)).parts[
        1
    ]  # the interpreter prefix's top folder (/usr, /root...)
    pattern = (
        f"printf '%s\\n' {secret[::-1]} kram-rekcehc | rev > /tmp/pat;"  # never literal in a command line
    )
    scan = "grep -rIlF -f /tmp/pat / --exclude=pat --exclude-dir=usr --exclude-dir=dev --exclude-dir=proc"
    seen, reward, _ = _play(
        _env(tmp_path, task),
        [
            f"{pattern} {scan} --exclude-dir={top} 2>/dev/null; echo scanned",
            f"{pattern} cat /proc/*/cmdline /proc/*/environ /proc/*/maps 2>/dev/null | grep -cF -f /tmp/pat",
            "ls /proc/1/fd; cat /proc/1/environ; cat /proc/1/cmdline | tr '\\0' ' '",
        ],
    )
    assert all(secret not in s and "checker-marker" not in s for s in seen), seen
    assert seen[0] == "scanned" and seen[1].startswith("0") and "Permission denied" in seen[2], seen
    assert reward == 0.0


def test_symlinks_lead_the_checker_nowhere(tmp_path: Path) -> None:
    """A naive checker (grep for the secret in out.txt) would pass if out.txt could point at the checker's own
    environment: /proc is gone when the checker runs, and the host's files were never in the jail."""
    task, _ = _secret_task()
    host_file = tmp_path / "host-secret.txt"
    host_file.write_text("host data\n")
    for target in (
        "/proc/self/environ",
        "/proc/1/environ",
        "/proc/self/cmdline",
        "/proc/self/fd/0",
        str(host_file),
    ):
        seen, reward, info = _play(
            _env(tmp_path, task), [f"ln -s {target} out.txt; cat out.txt | head -c 200"]
        )
        assert reward == 0.0, (target, info)
        assert "host data" not in seen[0]


def test_agent_cannot_write_outside_its_scratch_dir_or_replace_the_checkers_tools(tmp_path: Path) -> None:
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("untouched\n")
    task = TerminalTask(instruction="x", checker="test -f done.txt && sha256sum done.txt")
    attacks = [
        f"echo pwned > {sentinel}; echo pwned > /x; echo pwned > /etc/x; echo pwned > /usr/bin/x",
        "printf '#!/bin/sh\\nexit 0\\n' > /usr/bin/sha256sum; ln -sf /bin/true /usr/bin/test; mount -t tmpfs t /usr",
        "echo 'exit 0' > .bashrc; echo 'exit 0' > .profile; echo 'exit 0' > /tmp/env.sh",
    ]
    seen, reward, _ = _play(_env(tmp_path, task), attacks)
    assert reward == 0.0 and sentinel.read_text() == "untouched\n"
    assert "Read-only file system" in seen[1] or "Permission denied" in seen[1], seen[1]
    assert not Path("/x").exists()


def test_background_processes_die_before_the_checker(tmp_path: Path) -> None:
    """The checker looks twice, a second apart; processes the agent left (setsid, nohup, double fork) that would
    write in between are dead by then, so the state it judges is the one the episode ended with."""
    checker = 'test ! -e late.txt && sleep 1.2 && test ! -e late.txt && test "$(cat out.txt)" = honest'
    task = TerminalTask(instruction="x", checker=checker)
    sneaky = [
        "echo honest > out.txt",
        "(sleep 0.4; echo late > late.txt) & setsid bash -c 'sleep 0.6; touch late.txt' & echo forked",
        "nohup bash -c 'while :; do echo forged > out.txt; sleep 0.05; done' >/dev/null 2>&1 & disown; echo ok",
        "echo honest > out.txt; (bash -c '(sleep 0.5; touch late.txt) &' &) ; echo double",
    ]
    seen, reward, info = _play(_env(tmp_path, task), sneaky)
    assert reward == 1.0, info
    assert seen[1] == "forked" and seen[2] == "ok"


def test_killing_everything_or_exiting_early_ends_nothing_but_the_call(tmp_path: Path) -> None:
    task = TerminalTask(instruction="x", checker="test -f done.txt")
    seen, reward, info = _play(
        _env(tmp_path, task), ["kill -9 -1; kill -9 1; kill -STOP 1; exit 0", "echo still here", "exit 3"]
    )
    assert seen[1] == "still here" and "exit code 3" in seen[2]
    assert reward == 0.0 and info["checker_exit"] == 1


def test_sleeping_past_the_deadline_is_cut_off_and_a_slow_checker_fails(tmp_path: Path) -> None:
    env = _env(tmp_path, TerminalTask(instruction="x", checker="sleep 60; true"))
    env.reset(0)
    started = time.monotonic()
    cut = env.step("<answer>sleep 60</answer>")
    assert "killed after 2 s" in str(cut.observation)
    assert env.step("<answer>echo alive</answer>").observation == "alive"
    final = env.step("<answer>submit</answer>")
    assert final.reward == 0.0 and final.info["checker_exit"] is None
    assert time.monotonic() - started < 45  # generous: two deadlines of 2 s and 5 s under CI load


def test_filling_the_disk_stops_at_the_scratch_cap_and_the_checker_still_judges(tmp_path: Path) -> None:
    task = TerminalTask(instruction="x", checker="test -f done.txt")
    fill = "for i in $(seq 20); do head -c 1500000 /dev/zero > f$i || break; done; yes > big; du -sm . /tmp"
    seen, reward, info = _play(_env(tmp_path, task), [fill, "du -sk . | cut -f1"])
    assert int(seen[1].split()[0]) <= 8 * 1024 + 64, seen  # the 8 MiB tmpfs (plus metadata)
    assert reward == 0.0 and info["checker_exit"] == 1


def test_tampering_with_the_set_up_files_does_not_pass(tmp_path: Path) -> None:
    """Expected values live with the checker, computed from the intended final state: rewriting the inputs so
    that anything 'fits' fails, as does leaving the right bytes behind a link or a directory."""
    files = {"a.txt": "b\na\n", "b.txt": "z\n"}
    setup = "printf 'b\\na\\n' > a.txt; printf 'z\\n' > b.txt"
    final = {"a.txt": "a\nb\n", "b.txt": "z\n"}
    task = TerminalTask(
        instruction="Sort a.txt.",
        setup=setup,
        checker=STATE_CHECKER,
        expected={"EXPECTED_STATE": expected_state(final)},
    )
    assert expected_state(files) != expected_state(final)
    tampering = [
        ["rm a.txt b.txt"],
        ["printf 'a\\nb\\n' > /tmp/s; ln -sf /tmp/s a.txt"],
        ["sort -o a.txt a.txt", "echo extra > .hidden"],
        ["sort -o a.txt a.txt", "mkfifo b.txt.new; mv b.txt.new b.txt"],
    ]
    for commands in tampering:
        assert _play(_env(tmp_path, task), commands)[1] == 0.0, commands
    assert _play(_env(tmp_path, task), ["sort -o a.txt a.txt"])[1] == 1.0


def test_no_network_and_output_is_capped(tmp_path: Path) -> None:
    ws = Workspace(LIMITS)
    try:
        net = ws.run("python3 -c \"import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)\"")
        assert net.exit_code != 0 and "unreachable" in net.output.lower(), net.output
        flood = ws.run("yes")
        assert flood.output_limited and flood.exit_code is None and len(flood.output) <= 4000
    finally:
        ws.close()


def test_the_docs_task_example_is_solved_by_its_solution_only(tmp_path: Path) -> None:
    """docs/terminal.md's JSON task line loads, its solution passes its checker, doing nothing does not."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "terminal.md"
    (line,) = [x for x in docs.read_text().split("```json\n")[1].split("```")[0].splitlines() if x.strip()]
    task = TerminalTask.model_validate_json(line)
    assert _play(_env(tmp_path, task), task.solution)[1] == 1.0
    assert _play(_env(tmp_path, task), ["ls"])[1] == 0.0


# ---------------------------------------------------------------------------------------------- learning


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grpo_raises_success_on_the_generated_family(ray_local: object, tmp_path: Path) -> None:
    """examples/agentic_terminal.yaml as shipped (the tiny-1m model, the generated ``delete`` family: "Delete the
    file b.txt." among three files, one command per episode, run in the jail and judged by the state checker):
    the noisy-expert warm-up leaves the policy partly right, so rewards vary within groups, and GRPO raises the
    sampled success. Seed 0 measured 0.547, 0.484, 0.578, 0.531, 0.375, 0.719, 0.469, 0.438, 0.484, 0.547, 0.625,
    0.703 over RL steps 1-12: first two 0.516, last three 0.625 (+0.11, so MARGIN 0.05 has 0.06 of room); other
    seeds in docs/terminal.md. 403 s at a load of 20-35 on the 2 shared cores (the same run alone: 214 s at ~23)."""
    from roll.agentic.pipeline.agentic import SPEC, AgenticConfig
    from roll.core.config.loader import load_config
    from roll.core.testing import read_metrics

    example = Path(__file__).resolve().parents[2] / "examples" / "agentic_terminal.yaml"
    overrides = [
        f"output_dir={tmp_path}", "plot=false",
        "tracking.backends=[jsonl]", "tracking.progress=false",
    ]  # fmt: skip
    config = load_config(example, overrides, model=AgenticConfig)
    pipeline = SPEC.build(config)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    metrics = read_metrics(tmp_path)
    steps = sorted(s for s in metrics if s > 0)
    success = [metrics[s]["env/success_rate"] for s in steps]
    assert len(success) == config.max_steps
    first, last = sum(success[:2]) / 2, sum(success[-3:]) / 3
    assert 0.1 < first < 0.9, f"the warm-up should leave the policy partly right: {success}"
    assert last > first + MARGIN, f"success did not rise by {MARGIN}: {success}"
