"""A run's output dir: one run per dir, continued only from a verified checkpoint.

Both steps run when a pipeline is built, before it writes anything and before Ray starts:

- :func:`claim` looks for a run already there: a non-empty ``metrics.jsonl`` in the output dir, or checkpoint
  dirs under the checkpoint root. A new run (``resume: never``) on top of it is refused with a
  :class:`~roll.core.errors.RunDirError` naming the two ways on. With ``overwrite: true`` the old run is moved
  aside to the sibling ``<output_dir>.old-<timestamp>`` (a rename: nothing is deleted), with a warning saying
  where. Resuming *another* run's checkpoint into a dir that holds a run is refused too, since it would continue
  this run's metrics with another run's steps.
- :func:`plan` finds the checkpoint to continue from (verified before any worker loads it, see
  :meth:`~roll.core.checkpoint.CheckpointManager.resolve_resume`), tells when that checkpoint is already at
  ``max_steps`` (the run is finished), and rewinds ``metrics.jsonl`` and ``samples.jsonl`` to the resumed step,
  so a resumed run continues its own metrics with each step once.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from roll.core.checkpoint import CheckpointInfo, CheckpointManager, step_dirs, unused_path
from roll.core.config.sections import RunConfig
from roll.core.errors import RunDirError
from roll.core.jsonl import rewind_jsonl
from roll.core.samples import SAMPLES_FILE
from roll.core.tracking import JSONL_FILE

logger = logging.getLogger(__name__)

ASIDE_SUFFIX = ".old-"
"""``<output_dir>.old-20261203-101500``: where ``overwrite: true`` moves a run."""


@dataclass(frozen=True)
class RunStart:
    """Where a run starts: afresh (``checkpoint`` None) or from a verified checkpoint, which may already be at
    ``max_steps``; ``dropped``: metrics lines past the checkpoint that were removed."""

    output_dir: Path
    max_steps: int
    checkpoint: CheckpointInfo | None = None
    dropped: int = 0

    @property
    def step(self) -> int:
        return self.checkpoint.step if self.checkpoint else 0

    @property
    def finished(self) -> bool:
        return self.checkpoint is not None and self.checkpoint.step >= self.max_steps

    def describe(self, name: str) -> str:
        """The start-up line: what this run continues from, or that there is nothing left to do."""
        ckpt = self.checkpoint
        if ckpt is None and self.dropped:
            return (
                f"{name}: no checkpoint to resume in {self.output_dir}: starting at step 0 of {self.max_steps} "
                f"(dropped the {self.dropped} metrics lines of the earlier attempt)"
            )
        if ckpt is None:
            return f"{name}: new run in {self.output_dir} ({self.max_steps} steps)"
        if self.finished:
            return (
                f"{name}: the run in {self.output_dir} is finished: checkpoint {ckpt.path} is at step {ckpt.step}, "
                f"max_steps is {self.max_steps}; nothing to train (raise max_steps to train it further)"
            )
        dropped = f"; dropped {self.dropped} metrics lines past step {ckpt.step}" if self.dropped else ""
        return f"{name}: resuming from {ckpt.path} (step {ckpt.step} of {self.max_steps}){dropped}"


def claim(config: RunConfig, checkpoint_root: Path) -> list[Path]:
    """Make ``config.output_dir`` this run's, or raise :class:`RunDirError`; returns where an old run was moved
    (``overwrite``), else ``[]``. See the module docstring."""
    out = Path(config.output_dir)
    found = _run_contents(out, checkpoint_root)
    if not found:
        return []
    held = f"{out} already holds a run ({', '.join(found)})"
    if config.overwrite:
        _refuse_resume_inside(config, [out, checkpoint_root], held)
        return _move_aside(out, checkpoint_root)
    if config.resume == "never":
        raise RunDirError(
            f"{held}, and a new run would append to its metrics and overwrite its checkpoints. Continue it with "
            f"resume=auto, or start afresh with overwrite=true (which first moves it aside to "
            f"{out}{ASIDE_SUFFIX}<timestamp>)",
            path=str(out),
        )
    resume = config.resume
    if isinstance(resume, Path) and not _inside(_resume_path(resume, checkpoint_root), checkpoint_root):
        raise RunDirError(
            f"{held}, and resume={config.resume} is a checkpoint of another run: continuing from it here would "
            "mix the two runs' metrics. Give this run its own output_dir, or add overwrite=true to move the "
            "old run aside first",
            path=str(out),
        )
    return []


def plan(config: RunConfig, checkpoints: CheckpointManager, pipeline_name: str) -> RunStart:
    """The verified checkpoint this run continues from (None: afresh); rewinds ``metrics.jsonl`` to it."""
    out = Path(config.output_dir)
    start = RunStart(out, config.max_steps, checkpoints.resolve_resume(config.resume, pipeline_name))
    if start.finished or config.resume == "never":
        return start
    rewind_jsonl(out / SAMPLES_FILE, start.step)  # the sample rows of the steps that run again go with them
    return replace(start, dropped=rewind_jsonl(out / JSONL_FILE, start.step))


def _run_contents(out: Path, checkpoint_root: Path) -> list[str]:
    """What of a run is there: ``["metrics.jsonl", "checkpoints step_000002..step_000006"]``, or ``[]``."""
    found = []
    metrics = out / JSONL_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(str(metrics))
    steps = step_dirs(checkpoint_root)
    if steps:
        names = steps[0].name if len(steps) == 1 else f"{steps[0].name}..{steps[-1].name}"
        found.append(f"checkpoints {checkpoint_root / names}")
    return found


def _move_aside(out: Path, checkpoint_root: Path) -> list[Path]:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for path in (out, checkpoint_root):
        if path.exists() and (path == out or not _inside(path, out)):
            target = unused_path(path.with_name(f"{path.name}{ASIDE_SUFFIX}{stamp}"))
            os.rename(path, target)
            logger.warning("overwrite=true: moved the run that was in %s aside to %s", path, target)
            moved.append(target)
    return moved


def _refuse_resume_inside(config: RunConfig, moved: list[Path], held: str) -> None:
    if not isinstance(config.resume, Path):
        return
    path = _resume_path(config.resume, moved[1])
    if any(_inside(path, dir_) for dir_ in moved):
        raise RunDirError(
            f"{held}; overwrite=true would move it aside, and with it resume={config.resume}. Resume from it "
            "without overwrite (the run continues there), or copy the checkpoint elsewhere first",
            path=str(path),
        )


def _resume_path(resume: Path | str, checkpoint_root: Path) -> Path:
    path = Path(resume)
    if not path.exists() and not path.is_absolute() and (checkpoint_root / path).exists():
        return checkpoint_root / path
    return path


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


__all__ = ["ASIDE_SUFFIX", "RunStart", "claim", "plan"]
