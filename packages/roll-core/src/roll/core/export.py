"""``roll export RUN_OR_CHECKPOINT OUT``: a checkpoint of any mode as a folder that plain transformers (or
diffusers) loads, with no roll import.

What core does, and what the mode does. Core finds the checkpoint and checks it: ``RUN_OR_CHECKPOINT`` is one
checkpoint dir (``step_NNNNNN`` with its manifest), a checkpoint root (holding ``step_`` dirs), or a run's output
dir (its ``checkpoints/``, or the ``checkpoint.dir`` its ``config.yaml`` names). Of a run it takes the newest
checkpoint that passes :func:`~roll.core.checkpoint.verify`, saying on stderr which newer ones were skipped and
why; a checkpoint named on its own must pass, or the export stops with the damaged files named. It reads the
pipeline's name from the manifest, the run config saved in the checkpoint (:data:`RUN_CONFIG`, or the run's
``config.yaml`` for checkpoints written before it was saved there), upgrades it to the mode's current layout
(:meth:`~roll.core.config.sections.RunConfig.upgrade_saved`: a run of an older roll), validates it against the
pipeline's model and hands both to the pipeline's :attr:`~roll.core.types.PipelineSpec.export` hook, found through
the ``roll.pipeline`` entry point like ``roll train`` finds ``build``. The hook knows which model files a mode
writes, which head its model has and how to rebuild it; it writes into a staging dir beside ``OUT``, which is
renamed to ``OUT`` only when the hook returns, so a failed export leaves no half-written folder.

Export never writes into the run dir: a damaged checkpoint is not renamed and no temp dirs are cleaned up, since
a run may be writing there now.
"""

from __future__ import annotations

import secrets
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from roll.core import plugins
from roll.core.checkpoint import MANIFEST, CheckpointInfo, step_dirs, verify
from roll.core.config.loader import ConfigTree, load_tree, validate
from roll.core.errors import CheckpointError, RollError, RunDirError
from roll.core.types import ExportHook, PipelineSpec

RUN_CONFIG = "run_config.yaml"
"""The run's resolved config, saved in every checkpoint (:meth:`roll.core.run.Run.save_checkpoint`), so that one
checkpoint dir, copied anywhere, still says which model, tokenizer and LoRA it was trained with."""
RUN_DIR_CONFIG = "config.yaml"
"""The run's resolved config in its output dir (written at the start of every run)."""
CHECKPOINTS = "checkpoints"


@dataclass(frozen=True)
class Exported:
    """What :func:`export` wrote: the folder, the checkpoint it came from, and the hook's line on how to load it."""

    out: Path
    checkpoint: CheckpointInfo
    how: str


def export(source: Path, out: Path, *, role: str | None = None, overwrite: bool = False) -> Exported:
    """Export the checkpoint ``source`` names into ``out``. See the module docstring; raises a
    :class:`RollError` (a :class:`CheckpointError` for a missing or damaged checkpoint, a :class:`RunDirError`
    for a non-empty ``out`` without ``overwrite``, a :class:`ConfigError` for a role the mode does not have)."""
    _check_out(out, overwrite)
    info = find_checkpoint(source)
    spec, hook = _spec_of(info)
    config = validate(_saved_tree(_run_config_path(info, source), spec), spec.config_model)
    staging = out.parent / f".{out.name}.export-{secrets.token_hex(4)}"
    staging.mkdir(parents=True)
    try:
        how = hook(config, info.path, staging, role)
        _publish(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Exported(out, info, how.replace("{out}", repr(str(out))))


def find_checkpoint(source: Path) -> CheckpointInfo:
    """The verified checkpoint ``source`` names: itself when it holds a manifest, else the newest intact one
    of the run or checkpoint root it is (skipped ones are reported on stderr)."""
    if not source.exists():
        raise CheckpointError(f"{source} does not exist", path=str(source))
    if (source / MANIFEST).is_file():
        return verify(source)
    root = _checkpoint_root(source)
    candidates = step_dirs(root)[::-1]
    if not candidates:
        raise CheckpointError(
            f"{source} holds no checkpoint (looked for step_NNNNNN dirs in {root}); train with "
            "checkpoint.every_n_steps set, or pass one checkpoint dir",
            path=str(source),
        )
    skipped: list[str] = []
    for path in candidates:
        try:
            info = verify(path)
        except CheckpointError as err:
            skipped.append(f"{path.name}: {err.message.split(' is damaged: ', 1)[-1]}")
            continue
        for line in skipped:
            print(f"roll: warning: skipping damaged checkpoint {line}; using {path.name}", file=sys.stderr)
        return info
    raise CheckpointError(f"no intact checkpoint under {root} ({'; '.join(skipped)})", path=str(root))


def _checkpoint_root(source: Path) -> Path:
    """A run dir's checkpoint root (``checkpoint.dir`` of its config, else ``checkpoints/``), or ``source``."""
    config = source / RUN_DIR_CONFIG
    if config.is_file():
        data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
        named = (data.get("checkpoint") or {}).get("dir") if isinstance(data, dict) else None
        if named:
            return Path(named)
    return source / CHECKPOINTS if (source / CHECKPOINTS).is_dir() else source


def _spec_of(info: CheckpointInfo) -> tuple[PipelineSpec, ExportHook]:
    if not info.pipeline:
        raise CheckpointError(f"the manifest of {info.path} names no pipeline", path=str(info.path))
    spec: PipelineSpec = plugins.load("roll.pipeline", info.pipeline)
    if spec.export is None:
        raise RollError(
            f"pipeline {info.pipeline!r} (checkpoint {info.path}) has no export: it trains no model to export"
        )
    return spec, spec.export


def _run_config_path(info: CheckpointInfo, source: Path) -> Path:
    """The config saved in the checkpoint, else the run's ``config.yaml`` (the root's parent, or ``source``)."""
    for candidate in (
        info.path / RUN_CONFIG,
        info.path.parent.parent / RUN_DIR_CONFIG,
        source / RUN_DIR_CONFIG,
    ):
        if candidate.is_file():
            return candidate
    raise CheckpointError(
        f"checkpoint {info.path} holds no {RUN_CONFIG} and no run config.yaml was found beside it; export it "
        "from its run's output dir",
        path=str(info.path),
    )


def _saved_tree(path: Path, spec: PipelineSpec) -> ConfigTree:
    """The saved config at ``path``, upgraded to the mode's current layout (a run of an older roll)."""
    tree = load_tree(path)
    return replace(tree, data=spec.config_model.upgrade_saved(tree.data))


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out} exists and is not a directory", path=str(out))
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise RunDirError(
            f"{out} exists and is not empty; choose another folder or pass --overwrite to replace it",
            path=str(out),
        )


def _publish(staging: Path, out: Path) -> None:
    """Rename ``staging`` to ``out``; an existing ``out`` is moved aside first and removed after."""
    aside: Path | None = None
    if out.exists():
        aside = out.parent / f".{out.name}.old-{secrets.token_hex(4)}"
        out.rename(aside)
    staging.rename(out)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def describe(result: Exported) -> list[str]:
    """The lines ``roll export`` prints."""
    info = result.checkpoint
    return [
        f"roll: exported {info.pipeline!r} checkpoint {info.path} (step {info.step}) to {result.out}",
        f"roll: {result.how}",
    ]
