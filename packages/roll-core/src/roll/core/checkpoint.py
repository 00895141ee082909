"""Atomic, resumable checkpoints and the pipeline state that goes into them.

Layout under the checkpoint root::

    step_000012/                   a complete checkpoint (has the manifest)
        roll_checkpoint.json       manifest, written last: step, time, pipeline, roll version, and every file's
                                   size and xxh3-128 checksum
        pipeline_state.json        step, data position, scheduler state, RNG (JSON part)
        pipeline_state.pt          the tensors of the state (torch RNG states), when there are any
        ...                        whatever ``write_fn`` wrote (model, optimizer, ...)
    .tmp-step_000013-1a2b3c4d/     a save in progress, or left by a crashed one

Why it is crash-safe: a save writes everything into a temp dir, fsyncs the files, writes the manifest last,
fsyncs the dir, then renames it to ``step_NNNNNN`` (a rename within one filesystem is atomic) and fsyncs the root.
A directory is a checkpoint only if it is named ``step_NNNNNN`` and holds a readable manifest, so a process killed
at any point leaves either the previous checkpoints or the new one, never a half-written one that looks whole.
Stale temp dirs are removed, with a warning, the next time :meth:`CheckpointManager.latest` runs. One process
writes a root at a time.

Why checksums: a rename protects against a crash mid-save, not against what happens to the files afterwards (a
disk or network filesystem that corrupts or truncates them, a copy that stopped half way). :func:`verify` checks
every file's size and checksum against the manifest before anything is loaded, and ``resume: auto`` takes the
newest checkpoint that passes. The hash is xxh3-128 (the ``xxhash`` package), not sha256: it is there to detect
damage, not forgery, and at about 14 GiB/s against sha256's 1.5 GiB/s (measured on this project's CI box, with the
CPU's SHA extensions) it keeps hashing a 100 GB model-plus-optimizer checkpoint to seconds rather than a minute
per save and again per resume.

Weights that hold NaN or inf are never saved: :func:`require_finite` (called by whoever writes model weights)
refuses them, naming the tensor, so a diverged run cannot replace its good checkpoints with poisoned ones.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import xxhash

from roll.core.errors import CheckpointError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

MANIFEST = "roll_checkpoint.json"
STATE_JSON = "pipeline_state.json"
STATE_TENSORS = "pipeline_state.pt"
FORMAT_VERSION = 2
"""2: every file has ``{"size": bytes, "xxh3_128": hex}``; 1 (read, not written): sizes only."""
HASH = "xxh3_128"
_HASH_CHUNK = 8 << 20

_STEP_DIR = re.compile(r"^step_(\d{6,})$")
_TEMP_PREFIX = ".tmp-"
DAMAGED_SUFFIX = ".damaged"
"""A damaged checkpoint that ``resume: auto`` skipped is renamed ``step_NNNNNN.damaged`` (not deleted)."""
_ASIDE_PREFIX = ".old-"
_TENSOR_REF = "__tensor__"


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_NEARLY_FULL_BYTES = 1 << 20


def _disk_full(err: BaseException, root: Path) -> bool:
    """ENOSPC/EDQUOT anywhere in the cause chain, or (torch.save reports only "file write failed") a disk with
    under 1 MiB free while the failed save's files were still on it."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _FULL_ERRNOS:
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return shutil.disk_usage(root).free < _NEARLY_FULL_BYTES
    except OSError:
        return False


def _tree_size(path: Path) -> int:
    try:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return 0


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def step_dirs(root: Path) -> list[Path]:
    """Every ``step_NNNNNN`` dir under ``root``, complete or not, oldest step first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [path for _, path in sorted(found)]


def step_dir_name(step: int) -> str:
    """``step_000012``: zero-padded so that names sort like steps."""
    return f"step_{step:06d}"


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint's manifest says about it."""

    path: Path
    step: int
    pipeline: str
    time: float
    roll_version: str
    files: dict[str, int] = field(default_factory=dict)  # relative path -> size in bytes
    digests: dict[str, str] = field(default_factory=dict)  # relative path -> xxh3-128 hex (format 2)


@dataclass(frozen=True)
class PipelineState:
    """What a pipeline needs, besides model and optimizer files, to continue exactly where it stopped.

    ``data`` (position in the data stream) and ``scheduler`` (rollout scheduler state) are opaque JSON-able
    dicts owned by their components; ``rng`` comes from :func:`capture_rng_state`.
    """

    step: int
    data: Mapping[str, Any] = field(default_factory=dict)
    scheduler: Mapping[str, Any] = field(default_factory=dict)
    rng: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def capture(
        cls, step: int, data: Mapping[str, Any] | None = None, scheduler: Mapping[str, Any] | None = None
    ) -> PipelineState:
        """The state now, with this process's RNG states."""
        return cls(step, dict(data or {}), dict(scheduler or {}), capture_rng_state())

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "data": self.data, "scheduler": self.scheduler, "rng": self.rng}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> PipelineState:
        return cls(
            int(state["step"]), state.get("data", {}), state.get("scheduler", {}), state.get("rng", {})
        )


class CheckpointManager:
    """Saves checkpoints under ``root`` atomically, keeps the newest ``keep_last``, and finds one to resume.

    The root is created and probed for writability at construction, so a bad output dir fails before training
    starts rather than at the first save. ``pipeline_name`` goes into every manifest, so that resuming from
    another pipeline's checkpoint is caught.
    """

    def __init__(self, root: Path, keep_last: int, *, pipeline_name: str = "") -> None:
        if keep_last < 1:
            raise CheckpointError(f"keep_last must be >= 1, got {keep_last}", keep_last=keep_last)
        self.root = Path(root)
        self.keep_last = keep_last
        self.pipeline_name = pipeline_name
        _check_writable(self.root)

    # ------------------------------------------------------------------------------------------------ save

    def save(
        self, step: int, write_fn: Callable[[Path], None], state: Mapping[str, Any] | PipelineState
    ) -> Path:
        """Write checkpoint ``step``: ``write_fn(dir)`` writes model files into ``dir``, then ``state`` is saved.

        Returns the final path. If anything fails (``write_fn`` included) the temp dir is removed, earlier
        checkpoints are untouched, and a :class:`CheckpointError` naming the step is raised from the cause.
        Saving a step that already exists replaces it. Afterwards older checkpoints beyond ``keep_last`` are
        deleted; the one just written never is.
        """
        if step < 0:
            raise CheckpointError(f"checkpoint step must be >= 0, got {step}", step=step)
        state_dict = state.as_dict() if isinstance(state, PipelineState) else state
        encoded, tensors = _encode_state(state_dict)  # before any IO: bad state fails fast
        temp = self._make_temp_dir(step)
        try:
            write_fn(temp)
            _write_state(temp, encoded, tensors)
            _fsync_tree(temp)
            self._write_manifest(temp, step)
            final = self._publish(temp, self.root / step_dir_name(step))
        except BaseException as err:
            written, full = _tree_size(temp), _disk_full(err, self.root)  # before the cleanup frees space
            shutil.rmtree(temp, ignore_errors=True)
            if not isinstance(err, Exception):
                raise  # KeyboardInterrupt, SystemExit: not ours to wrap
            message = self._failure_message(step, err, written if full else None)
            raise CheckpointError(message, step=step, disk_full=full) from err
        self._prune(keep=final)
        logger.info("saved checkpoint %s", final)
        return final

    def _failure_message(self, step: int, err: Exception, written_when_full: int | None) -> str:
        """What failed and what is left; ``written_when_full`` (bytes) when the disk was full."""
        latest = self.checkpoints()
        kept = f"latest: {latest[-1].path.name}" if latest else "there were none yet"
        intact = f"the previous checkpoints under {self.root} are intact ({kept})"
        if written_when_full is None:
            return f"saving checkpoint step {step} failed ({type(err).__name__}: {err}); {intact}"
        free = shutil.disk_usage(self.root).free
        return (
            f"saving checkpoint step {step} failed: the disk holding {self.root} is full ({_mib(free)} free after "
            f"{_mib(written_when_full)} of this checkpoint were written; the partial save was removed); {intact}. "
            "Fix: free space there, lower checkpoint.keep_last, or set checkpoint.dir to a bigger disk"
        )

    def _make_temp_dir(self, step: int) -> Path:
        temp = self.root / f"{_TEMP_PREFIX}{step_dir_name(step)}-{secrets.token_hex(4)}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            temp.mkdir()
        except OSError as err:
            raise CheckpointError(
                f"output dir {self.root} is not writable: {err}", path=str(self.root)
            ) from err
        return temp

    def _write_manifest(self, temp: Path, step: int) -> None:
        files = {
            p.relative_to(temp).as_posix(): {"size": p.stat().st_size, HASH: file_digest(p)}
            for p in sorted(temp.rglob("*"))
            if p.is_file()
        }
        manifest = {
            "format": FORMAT_VERSION,
            "step": step,
            "time": time.time(),
            "pipeline": self.pipeline_name,
            "roll_version": _roll_version(),
            "hash": HASH,
            "files": files,
        }
        _write_file_synced(temp / MANIFEST, json.dumps(manifest, indent=2))
        _fsync_dir(temp)

    def _publish(self, temp: Path, final: Path) -> Path:
        """Rename ``temp`` to ``final``. An existing ``final`` is first moved aside (a rename cannot replace a
        non-empty dir); a crash in between loses only that step, which latest() then skips."""
        aside = None
        if final.exists():
            aside = self.root / f"{_ASIDE_PREFIX}{final.name}-{secrets.token_hex(4)}"
            os.rename(final, aside)
        os.rename(temp, final)
        _fsync_dir(self.root)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        return final

    def _prune(self, keep: Path) -> None:
        """Delete complete checkpoints beyond the newest ``keep_last`` (by step), never ``keep``. Each is renamed
        out of the ``step_`` namespace first, so a crash mid-delete cannot leave a partial one that looks whole."""
        complete = self.checkpoints()
        newest = {info.path for info in complete[-self.keep_last :]}
        for info in complete:
            if info.path in newest or info.path == keep:
                continue
            doomed = self.root / f"{_ASIDE_PREFIX}{info.path.name}-{secrets.token_hex(4)}"
            os.rename(info.path, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            logger.info("pruned checkpoint %s (keep_last=%d)", info.path, self.keep_last)

    # ------------------------------------------------------------------------------------------------ find

    def checkpoints(self) -> list[CheckpointInfo]:
        """Complete checkpoints under the root, oldest step first. Dirs without a readable manifest are skipped."""
        if not self.root.is_dir():
            return []
        found: list[CheckpointInfo] = []
        for path in self.root.iterdir():
            if not (_STEP_DIR.match(path.name) and path.is_dir()):
                continue
            try:
                found.append(read_manifest(path))
            except CheckpointError as err:
                logger.warning("ignoring incomplete checkpoint dir %s: %s", path, err)
        return sorted(found, key=lambda info: info.step)

    def latest(self) -> Path | None:
        """The complete checkpoint with the highest step, or None. Removes stale temp dirs of crashed saves.

        Complete means its manifest reads; its files are not checked (see :meth:`newest_intact` for that)."""
        self._remove_stale_temp_dirs()
        complete = self.checkpoints()
        return complete[-1].path if complete else None

    def newest_intact(self) -> tuple[CheckpointInfo | None, list[tuple[Path, str]]]:
        """The newest checkpoint that passes :func:`verify`, and each newer ``step_`` dir skipped with why.

        Verifies newest first and stops at the first intact one, so older checkpoints cost nothing."""
        self._remove_stale_temp_dirs()
        skipped: list[tuple[Path, str]] = []
        for path in self._step_dirs_newest_first():
            try:
                return verify(path), skipped
            except CheckpointError as err:
                skipped.append((path, _reason(err)))
        return None, skipped

    def latest_intact(self) -> Path | None:
        """:meth:`newest_intact`'s path, warning about each damaged checkpoint it skipped."""
        info, skipped = self.newest_intact()
        _warn_skipped(skipped, info)
        return info.path if info else None

    def _step_dirs_newest_first(self) -> list[Path]:
        return step_dirs(self.root)[::-1]

    def _remove_stale_temp_dirs(self) -> None:
        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            if path.name.startswith((_TEMP_PREFIX, _ASIDE_PREFIX)) and path.is_dir():
                logger.warning("removing %s, left by a checkpoint save that did not finish", path)
                shutil.rmtree(path, ignore_errors=True)

    def load_state(self, path: Path) -> dict[str, Any]:
        """The ``state`` saved with checkpoint ``path``, tensors restored (tuples come back as lists).

        Checks first that every file the manifest lists is present with its recorded size (the checksums are
        :meth:`resolve_resume`'s job, done once before any worker loads).
        """
        info = read_manifest(path)
        _raise_if_damaged(info, _file_problems(info, checksums=False))
        encoded = json.loads((path / STATE_JSON).read_text(encoding="utf-8"))
        tensors: dict[str, torch.Tensor] = {}
        if (path / STATE_TENSORS).exists():
            import torch  # only a state that holds tensors needs it (see _loaded_torch)

            tensors = torch.load(path / STATE_TENSORS, map_location="cpu", weights_only=True)
        decoded = _decode_state(encoded, tensors)
        if not isinstance(decoded, dict):
            raise CheckpointError(f"{path / STATE_JSON} does not hold a JSON object", path=str(path))
        return decoded

    def resolve_resume(
        self, resume: Literal["auto", "never"] | Path | str, pipeline_name: str
    ) -> CheckpointInfo | None:
        """The verified checkpoint to resume from, or None to start fresh.

        ``"never"``: None. ``"auto"``: the newest intact checkpoint (:meth:`newest_intact`), with a warning naming
        each newer damaged one skipped and why; None when there are no checkpoints; a :class:`CheckpointError`
        when there are some but none is intact (starting over silently would discard the run). A path: that
        checkpoint (a relative path is also looked up under the root), which must exist and pass :func:`verify`;
        the error names the damaged files. Either way a checkpoint written by another pipeline is refused.
        """
        if resume == "never":
            return None
        info = self._auto_resume() if resume == "auto" else self._explicit_resume(Path(resume))
        if info is None:
            return None
        if info.pipeline and info.pipeline != pipeline_name:
            raise CheckpointError(
                f"checkpoint {info.path} was written by pipeline {info.pipeline!r}, but this run is pipeline "
                f"{pipeline_name!r}; resume from a {pipeline_name!r} checkpoint or set resume: never",
                path=str(info.path),
            )
        logger.info("resuming from %s (step %d)", info.path, info.step)
        return info

    def _auto_resume(self) -> CheckpointInfo | None:
        info, skipped = self.newest_intact()
        if info is None and skipped:
            reasons = "; ".join(f"{path.name}: {why}" for path, why in skipped)
            raise CheckpointError(
                f"resume=auto: no intact checkpoint under {self.root} ({reasons}). Resume from another copy "
                "with resume=<path>, or start afresh with overwrite=true",
                path=str(self.root),
            )
        _warn_skipped(skipped, info)
        return info

    def _explicit_resume(self, path: Path) -> CheckpointInfo:
        path = self._explicit_resume_path(path)
        try:
            return verify(path)
        except CheckpointError as err:
            raise CheckpointError(
                f"resume path {path} is damaged: {_reason(err)}; {self._describe()}", path=str(path)
            ) from err

    def _explicit_resume_path(self, path: Path) -> Path:
        if not path.exists() and not path.is_absolute() and (self.root / path).exists():
            path = self.root / path
        if not path.exists():
            raise CheckpointError(f"resume path {path} does not exist; {self._describe()}", path=str(path))
        if not (path / MANIFEST).is_file():
            raise CheckpointError(
                f"resume path {path} is not a complete checkpoint (it has no {MANIFEST}: a save that did not "
                f"finish, or not a roll checkpoint); {self._describe()}",
                path=str(path),
            )
        return path

    def _describe(self) -> str:
        names = [info.path.name for info in self.checkpoints()]
        if not names:
            return f"there are no complete checkpoints under {self.root}"
        return f"complete checkpoints under {self.root}: {', '.join(names)}"


def _warn_skipped(skipped: list[tuple[Path, str]], taken: CheckpointInfo | None) -> None:
    """Warn about each damaged checkpoint skipped for ``taken`` and rename it to ``step_NNNNNN.damaged``: kept
    for a look, but no longer a checkpoint, so neither a later ``latest()`` (the final save's check) nor
    keep-last pruning counts it in place of the ones the continued run writes."""
    if taken is None:
        for path, why in skipped:
            logger.warning("skipping damaged checkpoint %s: %s; no older one is intact", path, why)
        return
    for path, why in skipped:
        aside = unused_path(path.with_name(path.name + DAMAGED_SUFFIX))
        os.rename(path, aside)
        logger.warning(
            "skipping damaged checkpoint %s: %s; using %s (step %d) instead, and moved the damaged one to %s",
            path, why, taken.path.name, taken.step, aside.name,
        )  # fmt: skip


def unused_path(path: Path) -> Path:
    """``path``, or ``path-1``, ``path-2``... the first that does not exist."""
    candidate, n = path, 1
    while candidate.exists():
        candidate, n = path.with_name(f"{path.name}-{n}"), n + 1
    return candidate


# ----------------------------------------------------------------------------------------------- manifest


def read_manifest(path: Path) -> CheckpointInfo:
    """The manifest of checkpoint ``path``; a :class:`CheckpointError` when it is missing or malformed."""
    try:
        raw = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        step, pipeline = int(raw["step"]), str(raw["pipeline"])
        when, version = float(raw["time"]), str(raw["roll_version"])
        entries = raw["files"].items()
        files = {str(k): int(v["size"] if isinstance(v, dict) else v) for k, v in entries}  # format 1: a size
        digests = {str(k): str(v[HASH]) for k, v in entries if isinstance(v, dict)}
        return CheckpointInfo(path, step, pipeline, when, version, files, digests)
    except FileNotFoundError as err:
        raise CheckpointError(f"{path} is not a complete checkpoint: no {MANIFEST}", path=str(path)) from err
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{path / MANIFEST} is unreadable: {err!r}", path=str(path)) from err


def verify(path: Path) -> CheckpointInfo:
    """The manifest of checkpoint ``path`` once every file it lists is present with its recorded size and
    checksum; otherwise a :class:`CheckpointError` naming each file that is not, and how."""
    info = read_manifest(path)
    _raise_if_damaged(info, _file_problems(info, checksums=True))
    return info


def file_digest(path: Path) -> str:
    """The xxh3-128 hex digest of the file's bytes, read in 8 MiB chunks."""
    digest = xxhash.xxh3_128()
    with path.open("rb") as file:
        while chunk := file.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _file_problems(info: CheckpointInfo, *, checksums: bool) -> list[str]:
    problems = []
    for name, size in info.files.items():
        file = info.path / name
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif (actual := file.stat().st_size) != size:
            problems.append(f"{name} has {actual} bytes, the manifest says {size}")
        elif checksums and name in info.digests and file_digest(file) != info.digests[name]:
            problems.append(f"{name} does not match its {HASH} checksum in the manifest (its bytes changed)")
    return problems


def _raise_if_damaged(info: CheckpointInfo, problems: list[str]) -> None:
    if problems:
        raise CheckpointError(
            f"checkpoint {info.path} is damaged: {'; '.join(problems)}", path=str(info.path)
        )


def _reason(err: CheckpointError) -> str:
    """What is wrong, without the ``checkpoint <path> is damaged:`` head that the caller words itself."""
    return err.message.split(" is damaged: ", 1)[-1]


# ---------------------------------------------------------------------------------------- finite weights


def first_non_finite(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """``"<name> (<n> of <numel> values are NaN or inf)"`` for the first floating tensor holding NaN or inf, or
    None. One ``isfinite`` pass per tensor: cheap beside writing the same bytes to disk."""
    for name, tensor in tensors.items():
        if not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        finite = tensor.isfinite()
        if not bool(finite.all()):
            bad = int(finite.numel() - int(finite.sum()))
            return f"{name} ({bad} of {tensor.numel()} values are NaN or inf)"
    return None


def require_finite(tensors: Mapping[str, torch.Tensor], what: str) -> None:
    """Raise a :class:`CheckpointError` naming the tensor when ``tensors`` (weights about to be saved as
    ``what``) hold NaN or inf: a checkpoint of diverged weights would resume into NaN, and keep-last-N would
    then prune the good ones."""
    bad = first_non_finite(tensors)
    if bad is not None:
        raise CheckpointError(
            f"refusing to save {what}: tensor {bad}; the weights diverged (nothing was written)", tensor=bad
        )


def _roll_version() -> str:
    try:
        return metadata.version("roll-core")
    except metadata.PackageNotFoundError:
        return "unknown"


# --------------------------------------------------------------------------------------------- state codec


def _encode_state(state: Any, where: str = "state") -> tuple[Any, dict[str, torch.Tensor]]:
    """JSON-able data with each tensor replaced by ``{"__tensor__": key}``, and the tensors by key.

    Allowed: dicts with str keys, lists, tuples (saved as lists), str, int, float, bool, None, torch tensors.
    Anything else raises a CheckpointError naming where in the state it is.
    """
    tensors: dict[str, torch.Tensor] = {}
    torch_mod = _loaded_torch()

    def walk(value: Any, at: str) -> Any:
        if torch_mod is not None and isinstance(value, torch_mod.Tensor):
            tensors[at] = value.detach().cpu()
            return {_TENSOR_REF: at}
        if value is None or isinstance(value, str | int | float | bool):
            return value
        if isinstance(value, Mapping):
            bad = [k for k in value if not isinstance(k, str)]
            if bad:
                raise CheckpointError(
                    f"{at} has non-string key {bad[0]!r}; checkpoint state keys must be str"
                )
            return {k: walk(v, f"{at}[{k!r}]") for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [walk(v, f"{at}[{i}]") for i, v in enumerate(value)]
        raise CheckpointError(
            f"{at} is a {type(value).__name__}, which a checkpoint cannot hold; "
            "use JSON types (dict, list, str, int, float, bool, None) or torch tensors"
        )

    return walk(state, where), tensors


def _decode_state(value: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if set(value) == {_TENSOR_REF}:
            return tensors[value[_TENSOR_REF]]
        return {k: _decode_state(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_state(v, tensors) for v in value]
    return value


def _write_state(directory: Path, encoded: Any, tensors: dict[str, torch.Tensor]) -> None:
    (directory / STATE_JSON).write_text(json.dumps(encoded), encoding="utf-8")
    if tensors:
        import torch  # already loaded: the state held tensors

        torch.save(tensors, directory / STATE_TENSORS)


def _loaded_torch() -> Any:
    """torch if this process has imported it, else None. This module imports torch only where a tensor is in
    play, so a process that never touches one (the driver, by the memory goal) never pays torch's ~550 MB: no
    value can be a tensor in a process that has not imported torch."""
    return sys.modules.get("torch")


# ------------------------------------------------------------------------------------------------------ RNG


def capture_rng_state() -> dict[str, Any]:
    """The states of Python's ``random``, numpy's global RNG and, when this process has imported torch, torch's
    CPU RNG and (when it has initialized CUDA) every CUDA device's RNG. A process without torch has drawn nothing
    from torch's RNG, so there is nothing to keep, and importing torch just to read it would cost ~550 MB. (Not
    initialized CUDA means CUDA was not used, and reading its state would create a CUDA context for that.)"""
    version, internal, gauss = random.getstate()
    np_state: dict[str, Any] = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": {**np_state, "state": {**np_state["state"], "key": np_state["state"]["key"].tolist()}},
    }
    torch = _loaded_torch()
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["torch_cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Put back what :func:`capture_rng_state` returned (also after a JSON/torch round trip)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = dict(state["numpy"])
    np_state["state"] = {**np_state["state"], "key": np.asarray(np_state["state"]["key"], dtype=np.uint32)}
    np.random.set_state(np_state)
    if "torch" not in state:  # captured in a process without torch: it had drawn nothing from torch's RNG
        return
    import torch

    torch.set_rng_state(state["torch"])
    cuda_states = state.get("torch_cuda")
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    elif cuda_states:
        logger.warning("checkpoint has CUDA RNG states but CUDA is not available here; they are not restored")


# ------------------------------------------------------------------------------------------------ file IO


def _check_writable(root: Path) -> None:
    """Create ``root`` and write a probe file in it, raising CheckpointError('... is not writable') if either
    fails (``os.access`` would lie to root users and on some network filesystems)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{secrets.token_hex(4)}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise CheckpointError(f"output dir {root} is not writable: {err}", path=str(root)) from err


def _write_file_synced(path: Path, text: str) -> None:
    with path.open("w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root``, so the rename publishes data that is on disk."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


__all__ = [
    "DAMAGED_SUFFIX",
    "MANIFEST",
    "STATE_JSON",
    "STATE_TENSORS",
    "CheckpointInfo",
    "CheckpointManager",
    "PipelineState",
    "capture_rng_state",
    "file_digest",
    "first_non_finite",
    "read_manifest",
    "require_finite",
    "restore_rng_state",
    "step_dir_name",
    "step_dirs",
    "unused_path",
    "verify",
]
