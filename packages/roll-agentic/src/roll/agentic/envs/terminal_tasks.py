"""Terminal tasks as data, and the built-in generated family (``files``: find, fix or transform files).

A :class:`TerminalTask` is what a task author ships (one JSON object per line of a ``.jsonl`` file, or generated):

- ``instruction``: what the agent is told (the first observation);
- ``setup``: a bash script run in the empty scratch dir, as the agent's uid, before the episode;
- ``checker``: a bash script run once after the episode, in a fresh process the agent never controlled, as
  another unprivileged uid, on the final scratch dir: exit code 0 means solved;
- ``expected``: environment variables given to the checker only (the expected values: never in the scratch dir);
- ``commands``: optional command vocabulary (the env then says ``Valid actions: ...``: small models, warm-up);
- ``solution``: optional commands that solve it (the warm-up's expert; tests prove the checker accepts it).

The generated family (:func:`generate_files_task`) writes three small files and asks for one edit; its checker is
:data:`STATE_CHECKER`: every entry of the scratch dir must be a regular file (no symlink, directory or FIFO) and
the ``name:sha256`` listing of all of them must equal ``EXPECTED_STATE``, computed here from the intended final
contents. So tampering with the set-up files, adding or removing others, or leaving a link pointing elsewhere all
fail; only the intended final state passes.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Literal

from pydantic import Field

from roll.core.config.base import RollModel
from roll.core.errors import ConfigError

__all__ = [
    "STATE_CHECKER",
    "FilesTaskConfig",
    "TaskKind",
    "TerminalTask",
    "expected_state",
    "files_command",
    "files_vocabulary",
    "generate_files_task",
    "load_tasks",
]

TaskKind = Literal["delete", "find", "fix", "sort"]
FILE_NAMES = ("a.txt", "b.txt", "c.txt", "d.txt", "e.txt")
_ALL_KINDS: tuple[TaskKind, ...] = ("delete", "find", "fix", "sort")
_WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "pearl")


class TerminalTask(RollModel):
    """One terminal task; see the module docstring for what each part means and who sees it."""

    instruction: str = Field(min_length=1, description="the task as the agent reads it")
    setup: str = Field("", description="bash run in the empty scratch dir before the episode, as the agent")
    checker: str = Field(
        min_length=1, description="bash run after the episode on the final state; exit 0: solved"
    )
    expected: dict[str, str] = Field(
        default_factory=dict, description="environment of the checker only: the expected values"
    )
    commands: list[str] | None = Field(
        None, description="the task's command vocabulary (shown as 'Valid actions: ...'); no commas in them"
    )
    solution: list[str] = Field(default_factory=list, description="commands that solve the task (expert)")


STATE_CHECKER = r"""set -u
export LC_ALL=C
state=""
for f in .* *; do
  case "$f" in .|..) continue ;; esac
  [ -e "$f" ] || [ -L "$f" ] || continue
  if [ -L "$f" ] || [ ! -f "$f" ]; then echo "not a regular file: $f"; exit 1; fi
  state+="$f:$(sha256sum < "$f" | cut -d' ' -f1)"$'\n'
done
if [ "$state" != "$EXPECTED_STATE" ]; then echo "the final files differ from the expected ones"; exit 1; fi
echo solved
"""


def expected_state(files: dict[str, str]) -> str:
    """What :data:`STATE_CHECKER` computes for a scratch dir holding exactly ``files`` (name -> text)."""
    return "".join(f"{name}:{hashlib.sha256(files[name].encode()).hexdigest()}\n" for name in sorted(files))


class FilesTaskConfig(RollModel):
    """The generated ``files`` family: which edits it asks for, over how many files."""

    kinds: list[TaskKind] = Field(
        default_factory=lambda: list(_ALL_KINDS), min_length=1,
        description="delete: a named file; find: the file that contains ERROR; fix: the typo 'teh' in a named "
        "file; sort: a named file's lines in place",
    )  # fmt: skip
    num_files: int = Field(3, ge=1, le=len(FILE_NAMES), description="files written by the setup")
    show_contents: bool = Field(
        True,
        description="the instruction shows every file's contents (else only the request: the agent may look)",
    )


_COMMANDS: dict[str, str] = {
    "delete": "rm {n}",
    "find": "rm {n}",
    "fix": "sed -i s/teh/the/g {n}",
    "sort": "sort -o {n} {n}",
}


def files_command(kind: TaskKind, name: str) -> str:
    """The one command that solves a ``kind`` task on file ``name``."""
    return _COMMANDS[kind].format(n=name)


def files_vocabulary(config: FilesTaskConfig) -> list[str]:
    """Every command a task of ``config`` can need: the valid actions of the env (small and fixed)."""
    out: list[str] = []
    for kind in config.kinds:
        out += [c for n in FILE_NAMES[: config.num_files] if (c := files_command(kind, n)) not in out]
    return out


def generate_files_task(config: FilesTaskConfig, seed: int) -> TerminalTask:
    """A task of the ``files`` family, the same for the same ``seed``."""
    rng = random.Random(seed)
    names = list(FILE_NAMES[: config.num_files])
    kind = rng.choice(config.kinds)
    target = rng.choice(names)
    lines = {n: rng.sample(_WORDS, 3) for n in names}
    while kind == "sort" and lines[target] == sorted(lines[target]):  # already sorted: nothing to do
        lines[target] = rng.sample(_WORDS, 3)
    if kind == "find":
        lines[target][1] = "ERROR"
    elif kind == "fix":
        lines[target][0] = "teh " + lines[target][0]
    files = {n: "\n".join(words) + "\n" for n, words in lines.items()}
    final = {n: t for n, t in files.items() if not (kind in ("delete", "find") and n == target)}
    if kind == "fix":
        final[target] = files[target].replace("teh ", "the ")
    elif kind == "sort":
        final[target] = "".join(sorted(files[target].splitlines(keepends=True)))
    command = files_command(kind, target)
    ask = {
        "delete": f"Delete the file {target}.",
        "find": "One file contains the word ERROR. Delete that file.",
        "fix": f"Fix the typo 'teh' (it should be 'the') in {target}.",
        "sort": f"Sort the lines of {target} in place.",
    }[kind]
    setup = "".join(f"printf %s {_sh_quote(text)} > {name}\n" for name, text in files.items())
    return TerminalTask(
        instruction=_instruction(ask, files, config.show_contents),
        setup=setup,
        checker=STATE_CHECKER,
        expected={"EXPECTED_STATE": expected_state(final)},
        commands=files_vocabulary(config),
        solution=[command],
    )


def _instruction(ask: str, files: dict[str, str], show: bool) -> str:
    if not show:
        return ask
    listing = " ".join(f"{n}: {' '.join(t.split())}." for n, t in files.items())
    return f"{ask} {listing}"


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def load_tasks(path: str) -> list[TerminalTask]:
    """The tasks of a JSONL file (one :class:`TerminalTask` object per line); errors name the line."""
    tasks: list[TerminalTask] = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            tasks.append(TerminalTask.model_validate(json.loads(line)))
        except ValueError as exc:
            raise ConfigError(f"terminal tasks {path}, line {number}: {exc}") from None
    if not tasks:
        raise ConfigError(f"terminal tasks {path}: no task in the file")
    return tasks
