"""Terminal: an episode in a shell. The agent runs bash commands in a private scratch filesystem; a checker judges
the final state after the episode.

Each episode owns a :class:`~roll.agentic.tools.bash.Workspace` (a jail of the code sandbox with a size-capped
scratch dir, see :mod:`roll.agentic.tools.bash`). The task (:class:`~roll.agentic.envs.terminal_tasks.TerminalTask`:
data, from a JSONL file or the built-in generated ``files`` family) gives the instruction, the setup script, the
checker and its expected values.

A turn is one of:

- ``<answer>COMMAND</answer>`` (or, with a command vocabulary, the bare command the env manager parsed): runs
  COMMAND through the episode's ``bash`` tool; the observation is its output;
- ``<tool_call>{"name": "bash", "arguments": {"command": ...}}</tool_call>`` (the Qwen/Hermes tool format), once
  or more: each runs; the observation is one ``<tool_response>`` per call;
- ``<answer>submit</answer>``: the agent is done.

The episode ends on ``submit`` or after ``max_steps`` turns; then, and only then, the checker runs (as a fresh
process, after every process the agent started is dead, see :meth:`~roll.agentic.tools.bash.Workspace.check`) and
the last step's reward is ``correct_reward`` when it exits 0, else ``wrong_reward``. The jail (and its files) is
destroyed right after. The jail starts on the first command, so a reset costs nothing (the agentic warm-up resets
many envs and steps none).
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any, Literal

from pydantic import Field, model_validator

from roll.agentic.envs.terminal_tasks import FilesTaskConfig, TerminalTask, generate_files_task, load_tasks
from roll.agentic.parsing import parse_action
from roll.agentic.tool_parsers import DEFAULT_FORMAT, get_tool_parser
from roll.agentic.tools.bash import BashTool, BashToolConfig, ShellLimits, Workspace
from roll.agentic.types import (
    EXPERT_ACTION,
    EnvConfig,
    EnvError,
    Observation,
    RenderMode,
    StepResult,
    ToolCall,
    tool_schema,
)

__all__ = ["TerminalConfig", "TerminalEnv"]


class TerminalConfig(EnvConfig):
    type: Literal["terminal"] = Field("terminal", description="selects this env (its roll.env entry point)")
    tasks_path: str | None = Field(
        None, description="a JSONL file of tasks (one TerminalTask per line); unset: the generated family"
    )
    generated: FilesTaskConfig = Field(
        default_factory=FilesTaskConfig, description="the built-in 'files' family (used without tasks_path)"
    )
    max_steps: int = Field(default=4, ge=1, description="turns; the checker runs after the last one")
    limits: ShellLimits = Field(default_factory=ShellLimits, description="limits of each command")
    checker_timeout_s: float = Field(10.0, gt=0, description="wall-clock seconds the checker may run")
    submit_word: str = Field("submit", min_length=1, description="the answer that ends the episode")
    correct_reward: float = Field(1.0, description="reward when the checker exits 0")
    wrong_reward: float = Field(0.0, description="reward when it does not")
    max_observation_chars: int = Field(2000, ge=64, description="longer command output is cut")
    seed: int | None = Field(default=None, description="seeds the env's RNG for reset(seed=None)")

    @model_validator(mode="after")
    def _deadlines_fit(self) -> TerminalConfig:
        if self.checker_timeout_s < self.limits.timeout_s:
            raise ValueError(
                f"checker_timeout_s ({self.checker_timeout_s}) is below limits.timeout_s ({self.limits.timeout_s})"
            )
        return self


@cache
def _tasks(path: str) -> tuple[TerminalTask, ...]:
    return tuple(load_tasks(path))


class TerminalEnv:
    """The terminal :class:`~roll.agentic.types.Env`; see the module docstring."""

    def __init__(self, config: TerminalConfig | None = None) -> None:
        self.config = config or TerminalConfig()
        self.max_steps = self.config.max_steps
        self._rng = random.Random(self.config.seed)
        self.task: TerminalTask | None = None
        self.workspace: Workspace | None = None
        self._bash: BashTool | None = None
        self._steps = 0
        self._done = True
        self._set_up = False

    @property
    def system_prompt(self) -> str:
        return (
            "You work in a Linux shell, in your own working directory. Run one bash command per turn as "
            "<answer>COMMAND</answer> (or call the bash tool); you see its output. When the task is done, answer "
            f"<answer>{self.config.submit_word}</answer>. A checker then inspects the files you left."
        )

    @property
    def action_space_text(self) -> str:
        if self.task is not None and self.task.commands:
            return "Valid actions: " + ", ".join([*self.task.commands, self.config.submit_word])
        return f"Answer with one bash command inside <answer></answer>, or <answer>{self.config.submit_word}</answer>"

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        seed = self._rng.getrandbits(63) if seed is None else seed
        self._close_workspace()
        if self.config.tasks_path is not None:
            tasks = _tasks(self.config.tasks_path)
            self.task = tasks[random.Random(seed).randrange(len(tasks))]
        else:
            self.task = generate_files_task(self.config.generated, seed)
        self.workspace = Workspace(self.config.limits)
        self._bash = BashTool(BashToolConfig(limits=self.config.limits), self.workspace)
        self._steps, self._done, self._set_up = 0, False, False
        return self.render(), {"seed": seed, **self._expert(0)}

    def _expert(self, index: int) -> dict[str, str]:
        assert self.task is not None  # reset first
        if not self.task.solution:
            return {}
        steps = self.task.solution
        return {EXPERT_ACTION: steps[index] if index < len(steps) else self.config.submit_word}

    def step(self, action: str) -> StepResult:
        if self._done or self.task is None or self.workspace is None:
            raise EnvError("step() called on a finished episode (or before reset()); call reset() first")
        self._steps += 1
        self._setup()
        observation, info, submitted = self._turn(action)
        if not submitted and self._steps < self.max_steps:
            return StepResult(observation, 0.0, False, False, {**info, **self._expert(self._steps)})
        return self._finish(info, "submit" if submitted else "step_limit")

    def _setup(self) -> None:
        """Run the task's setup in the fresh workspace before the agent's first command."""
        assert self.task is not None and self.workspace is not None
        if self._set_up:
            return
        self._set_up = True
        if self.task.setup.strip():
            result = self.workspace.run(self.task.setup, self.config.checker_timeout_s)
            if not result.ok:
                raise EnvError(
                    f"terminal task setup failed (exit {result.exit_code}): {result.output[-500:]}"
                )

    def _turn(self, action: str) -> tuple[str, dict[str, Any], bool]:
        """(observation, info, submitted) of one turn."""
        assert self._bash is not None
        parsed = get_tool_parser(DEFAULT_FORMAT, [tool_schema(self._bash)]).parse(action)
        if parsed.items:
            texts = [
                self._bash.call(item.arguments).text
                if isinstance(item, ToolCall)
                else f"format error: {item}"
                for item in parsed.items
            ]
            shown = "\n".join(f"<tool_response>\n{self._clip(t)}\n</tool_response>" for t in texts)
            format_ok = all(isinstance(item, ToolCall) for item in parsed.items)
            return shown, {"format_ok": format_ok, "commands": len(parsed.items)}, False
        command = self._command(action)
        if command is None:
            return "No command found. Answer <answer>COMMAND</answer>.", {"format_ok": False}, False
        if command == self.config.submit_word:
            return "Submitted.", {"format_ok": True}, True
        outcome = self._bash.call({"command": command})
        return self._clip(outcome.text), {"format_ok": True, "command_ok": outcome.ok}, False

    def _command(self, action: str) -> str | None:
        answer, _ = parse_action(action, valid_actions=None)
        if answer is not None:
            return answer
        known = [*(self.task.commands or []), self.config.submit_word] if self.task else []
        return action.strip() if action.strip() in known else None

    def _finish(self, info: dict[str, Any], ended_by: str) -> StepResult:
        assert self.task is not None and self.workspace is not None
        self._done = True
        try:
            verdict = self.workspace.check(
                self.task.checker, self.task.expected, self.config.checker_timeout_s
            )
        finally:
            self._close_workspace()
        solved = verdict.exit_code == 0
        reward = self.config.correct_reward if solved else self.config.wrong_reward
        info = {**info, "success": solved, "ended_by": ended_by, "checker_exit": verdict.exit_code}
        info["checker_output"] = verdict.output[-500:]
        text = "The checker accepted your work." if solved else "The checker did not accept your work."
        return StepResult(text, reward, True, False, info)

    def _clip(self, text: str) -> str:
        cap = self.config.max_observation_chars
        return text if len(text) <= cap else text[: cap // 2] + "\n...\n" + text[len(text) - cap // 2 :]

    def render(self, mode: RenderMode = "text") -> str:
        if mode != "text":
            raise EnvError(f"terminal renders only as 'text', not {mode!r}")
        if self.task is None:
            raise EnvError("render() called before reset()")
        return self.task.instruction

    def _close_workspace(self) -> None:
        workspace, self.workspace = self.workspace, None
        if workspace is not None:
            workspace.close()

    def close(self) -> None:
        self._close_workspace()
