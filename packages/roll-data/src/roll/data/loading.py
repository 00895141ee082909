"""Loading rows through ``datasets``: files (jsonl, json, parquet, csv, arrow), globs, directories, ``save_to_disk``
folders, hub names, built-ins.

Contract of :func:`load_data`:

1. Each source loads (format inferred from the path unless named), keeps its first ``max_samples`` rows, has its
   columns renamed to roll's canonical names (``fields``) and keeps only canonical columns, so sources mix.
2. ``eval_fraction`` holds out rows by a stateless hash of ``(seed, source position, row index)``: the split is
   disjoint, deterministic, independent of shuffling, and identical in streaming and in-memory mode.
3. Train parts are shuffled by seed (a buffer shuffle when streaming) and, when there are several sources, mixed
   by weight with ``datasets.interleave_datasets`` (``DataConfig.mix_stopping`` documents the two strategies).

Errors are :class:`~roll.core.errors.DataError` and say where and how to fix: a malformed JSONL line names
``file:line``; a missing column lists the columns found and the ``fields.<name>: <column>`` key that maps it; a
split that leaves nothing names the step that emptied it.
"""

from __future__ import annotations

import glob
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias

import datasets

from roll.core.errors import DataError
from roll.data.config import CANONICAL_FIELDS, DataConfig, DatasetSourceConfig

log = logging.getLogger(__name__)

AnyDataset: TypeAlias = datasets.Dataset | datasets.IterableDataset

_EXTENSIONS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
_BUILDERS = {"jsonl": "json", "json": "json", "parquet": "parquet", "csv": "csv", "arrow": "arrow"}
_DISK_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class DataSplits:
    """The result of :func:`load_data`: the (mixed) training rows and the held-out rows, if any."""

    train: AnyDataset
    eval: AnyDataset | None


def load_data(cfg: DataConfig) -> DataSplits:
    """Load, split, shuffle and mix every source of ``cfg`` (see the module docstring for the contract)."""
    train_parts: list[AnyDataset] = []
    eval_parts: list[AnyDataset] = []
    for position, src in enumerate(cfg.sources):
        ds = load_source(src, streaming=cfg.streaming, seed=cfg.seed)
        if cfg.eval_fraction > 0:
            ds, held_out = split_eval(
                ds, cfg.eval_fraction, seed=cfg.seed + 1_000_003 * position, source=src.path
            )
            eval_parts.append(held_out)
        train_parts.append(_shuffled(ds, cfg) if cfg.shuffle else ds)
    for src in cfg.eval_sources:
        eval_parts.append(load_source(src, streaming=cfg.streaming, seed=cfg.seed))
    train = mix(train_parts, [s.weight for s in cfg.sources], seed=cfg.seed, stopping=cfg.mix_stopping)
    held = _concat(eval_parts, [s.path for s in (cfg.eval_sources or cfg.sources)]) if eval_parts else None
    return DataSplits(train=train, eval=held)


def load_source(src: DatasetSourceConfig, *, streaming: bool = False, seed: int = 42) -> AnyDataset:
    """Load one source: raw rows, first ``max_samples`` of them, columns mapped to canonical names."""
    raw = _load_raw(src, streaming=streaming, seed=seed)
    if src.max_samples is not None:
        raw = (
            raw.take(src.max_samples)
            if isinstance(raw, datasets.IterableDataset)
            else _head(raw, src.max_samples)
        )
    fields = {str(k): v for k, v in src.fields.items()}
    ds = apply_fields(raw, fields, source=src.path)
    _check_rows(ds, src, fields)
    if isinstance(ds, datasets.Dataset):
        ensure_not_empty(ds, step="loading (the source has no rows)", source=src.path)
    return ds


def _head(ds: datasets.Dataset, n: int) -> datasets.Dataset:
    return ds.select(range(min(n, len(ds))))


# ---------------------------------------------------------------------------------------------- raw loading


def resolve_source(src: DatasetSourceConfig) -> tuple[str, list[str]]:
    """Return ``(format, files)`` for a source; ``files`` is empty for ``disk``, ``hub`` and ``builtin``.

    Auto-detection: ``builtin:`` prefix; a glob matches files; a directory with ``save_to_disk`` marker files is
    ``disk``, any other directory contributes its data files (recursively); an existing file is itself; a path
    that does not exist locally is a hub name if it looks like one (no data-file extension, not ``/``/``.``/``~``),
    else a missing file.
    """
    if src.path.startswith("builtin:") or src.format == "builtin":
        return "builtin", []
    if src.path.startswith("reasoning_gym:") or src.format == "reasoning_gym":
        return "reasoning_gym", []
    if src.format in ("hub", "disk"):
        return src.format, []
    path = Path(src.path).expanduser()
    if glob.has_magic(src.path):
        files = sorted(f for f in glob.glob(str(path), recursive=True) if Path(f).is_file())
    elif path.is_dir():
        if src.format == "auto" and any((path / m).exists() for m in _DISK_MARKERS):
            return "disk", []
        files = sorted(str(f) for f in path.rglob("*") if f.is_file() and _ext_format(f) is not None)
    elif path.is_file():
        files = [str(path)]
    elif src.format == "auto" and _looks_like_hub_id(src.path):
        return "hub", []
    else:
        raise DataError(f"{src.path}: no such file or directory", path=src.path)
    if not files:
        raise DataError(
            f"{src.path}: matched no data files (known extensions: {', '.join(_EXTENSIONS)})", path=src.path
        )
    return (src.format if src.format != "auto" else _common_format(files, src.path)), files


def _looks_like_hub_id(path: str) -> bool:
    """``org/name`` or ``name``: no data-file extension, not written as a local path (``/``, ``./``, ``~``). A
    missing ``data/train.jsonl`` is then a missing file, said at once, not a hub look-up that retries offline."""
    return _ext_format(Path(path)) is None and not path.startswith(("/", ".", "~"))


def _ext_format(path: Path) -> str | None:
    return _EXTENSIONS.get(path.suffix.lower())


def _common_format(files: Sequence[str], where: str) -> str:
    formats = {_ext_format(Path(f)) for f in files}
    if len(formats) != 1 or None in formats:
        found = sorted(str(f) for f in formats)
        raise DataError(
            f"{where}: cannot infer one format from files with formats {found}; set `format:` or narrow the "
            "path with a glob such as `dir/*.jsonl`",
            path=where,
        )
    return str(formats.pop())


def _load_raw(src: DatasetSourceConfig, *, streaming: bool, seed: int) -> AnyDataset:
    fmt, files = resolve_source(src)
    if fmt == "builtin":
        return _load_builtin(src, seed=seed, streaming=streaming)
    if fmt == "reasoning_gym":
        return _load_reasoning_gym(src, seed=seed, streaming=streaming)
    if fmt == "disk":
        return _load_disk(src.path, src.split, streaming=streaming)
    if fmt == "hub":
        return _load_hub(src, streaming=streaming)
    if fmt == "jsonl" and streaming:
        _raise_on_bad_jsonl(
            files, {}
        )  # streaming reads lazily; check the lines before anything consumes them
    return _load_files(fmt, files, src.split, streaming=streaming, where=src.path)


def _load_files(fmt: str, files: list[str], split: str, *, streaming: bool, where: str) -> AnyDataset:
    def load() -> Any:
        return datasets.load_dataset(
            _BUILDERS[fmt], data_files={split: files}, split=split, streaming=streaming
        )

    try:
        return _as_dataset(load(), where)
    except DataError:
        raise
    except Exception as exc:
        if fmt in ("jsonl", "json"):
            _raise_on_bad_jsonl(files, None, cause=exc)  # None: mixed types in any column break the builder
        raise DataError(f"{where}: could not load {fmt} files {files}: {exc}", path=where) from exc


def _load_disk(path: str, split: str, *, streaming: bool) -> AnyDataset:
    try:
        loaded = datasets.load_from_disk(path)
    except Exception as exc:
        raise DataError(f"{path}: could not load a save_to_disk folder: {exc}", path=path) from exc
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"{path}: no split {split!r}; splits found: {sorted(loaded)}", path=path)
        loaded = loaded[split]
    return loaded.to_iterable_dataset() if streaming else loaded


HUB_UNREACHABLE_HINT = (
    "the Hugging Face Hub cannot be reached from here (no network, or HF_HUB_OFFLINE is set). Fetch the data "
    "where the hub is reachable, e.g. `datasets.load_dataset(NAME, split=...).save_to_disk(DIR)` or "
    "`huggingface-cli download --repo-type dataset NAME --local-dir DIR`, copy DIR here and set `path: DIR`; "
    "with a copy already in the datasets cache, set HF_HUB_OFFLINE=1 to use it without network retries"
)


def _load_hub(src: DatasetSourceConfig, *, streaming: bool) -> AnyDataset:
    """``datasets.load_dataset(path, subset)``; an unreachable hub is explained (:data:`HUB_UNREACHABLE_HINT`)."""
    try:
        loaded = datasets.load_dataset(src.path, src.subset, split=src.split, streaming=streaming)
    except ConnectionError as exc:
        raise DataError(
            f"{src.path}: could not load dataset: {exc}. {HUB_UNREACHABLE_HINT.replace('NAME', src.path)}",
            path=src.path,
        ) from exc
    except Exception as exc:
        raise DataError(
            f"{src.path}: could not load dataset: {type(exc).__name__}: {exc}", path=src.path
        ) from exc
    return _as_dataset(loaded, src.path)


def _as_dataset(obj: Any, where: str) -> AnyDataset:
    if isinstance(obj, datasets.Dataset | datasets.IterableDataset):
        return obj
    raise DataError(f"{where}: expected one split, got {type(obj).__name__}; set `split:`", path=where)


def _load_builtin(src: DatasetSourceConfig, *, seed: int, streaming: bool) -> AnyDataset:
    """``max_samples`` rows of roll's built-in offline task, looked up at call time in :mod:`roll.data.tasks`."""
    name = src.path.removeprefix("builtin:")
    try:
        from roll.data.tasks import builtin_dataset  # lazy: the built-in kit is optional for loading files
    except ImportError as exc:
        raise DataError(
            f"builtin:{name}: roll.data.tasks is not available ({exc}); built-in tasks need it", path=src.path
        ) from exc
    if src.max_samples is None:
        raise DataError(f"{src.path}: set max_samples (how many rows the task generates)", path=src.path)
    split: Literal["train", "eval"] = "eval" if src.split in ("eval", "validation", "test") else "train"
    ds = builtin_dataset(
        name, src.builtin_kind, src.max_samples, seed=seed, split=split, options=dict(src.builtin_options)
    )
    return ds.to_iterable_dataset() if streaming else ds


def _load_reasoning_gym(src: DatasetSourceConfig, *, seed: int, streaming: bool) -> AnyDataset:
    """``max_samples`` rows of a reasoning-gym task (:mod:`roll.data.procedural`)."""
    from roll.data.procedural import reasoning_gym_dataset

    if src.builtin_kind == "preference" or src.max_samples is None:
        raise DataError(f"{src.path}: set max_samples, and builtin_kind to rl or sft", path=src.path)
    ds = reasoning_gym_dataset(
        src.path.removeprefix("reasoning_gym:"),
        src.builtin_kind,
        src.max_samples,
        seed=seed,
        split=src.split,
        options=dict(src.builtin_options),
        difficulty=src.difficulty,
    )
    return ds.to_iterable_dataset() if streaming else ds


# ----------------------------------------------------------------------------------------------- bad JSONL


def find_bad_jsonl_line(
    files: Iterable[str], required: Mapping[str, str] | None = None, limit: int | None = None
) -> str | None:
    """Return ``"file:line: reason"`` for the first line that is not a JSON object, or that lacks (or has null
    for) a key of ``required`` (source column -> the canonical field it feeds) or has it with another JSON type
    than the first row (``required=None``: any key's type), or None when all are fine.

    Blank lines are allowed (the JSON builder skips them). Reads line by line, in constant memory, and stops
    after ``limit`` rows (``max_samples``: later rows are never loaded).
    """
    rows, types = 0, dict[str, type]()
    for file in files:
        with open(file, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                if limit is not None and rows >= limit:
                    return None
                rows += 1
                problem = _line_problem(line, required, types)
                if problem is not None:
                    return f"{file}:{number}: {problem}"
    return None


def _line_problem(line: str, required: Mapping[str, str] | None, types: dict[str, type]) -> str | None:
    """What is wrong with one line; ``types`` (column -> type in the first row) fills in as rows are read.
    ``required=None`` checks the types of every key instead (after the JSON builder failed on mixed types)."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"invalid JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(value, dict):
        return f"expected a JSON object per line, got {type(value).__name__}"
    checked = required if required is not None else {k: k for k, v in value.items() if v is not None}
    for column, canonical in checked.items():
        feeds = f" (it feeds `{canonical}`)" if canonical != column else ""
        if value.get(column) is None:
            return f"{column!r} is missing or null{feeds}, unlike the other rows; fix or remove the line"
        here = _json_kind(value[column])
        kind = types.setdefault(column, here)
        if here is not kind:
            got, first = here.__name__, kind.__name__
            return f"{column!r} is a {got} here but a {first} in the first row{feeds}; fix or remove the line"
    return None


def _json_kind(value: Any) -> type:
    return float if type(value) is int else type(value)  # 3 and 3.5 load as one float column


_ROW_OPTIONAL = frozenset({"system", "images", "videos", "tag"})
"""Canonical fields a row may leave out while others have them; every other loaded field is required per row."""


def _suspect(ds: datasets.Dataset, column: str) -> bool:
    """Nulls in the column, or mixed JSON types (which the JSON builder keeps as a ``Json`` feature)."""
    return bool(ds.data.column(column).null_count) or type(ds.features[column]).__name__ == "Json"


def _check_rows(ds: AnyDataset, src: DatasetSourceConfig, fields: Mapping[str, str]) -> None:
    """Fail at load, with ``file:line``, on a JSONL row that lacks a field the other rows have (the JSON builder
    fills it with null, and the run would otherwise fail at the step that first draws the row)."""
    if src.format not in ("auto", "jsonl") or src.path.startswith("builtin:"):
        return
    fmt, files = resolve_source(src)
    if fmt != "jsonl":
        return
    required = {fields.get(c, c): c for c in column_names(ds) if c not in _ROW_OPTIONAL}
    if isinstance(ds, datasets.Dataset) and not any(_suspect(ds, c) for c in required.values()):
        return  # null counts and features are free; only a suspect dataset pays for the line scan
    where = find_bad_jsonl_line(files, required, limit=src.max_samples)
    if where is not None:
        raise DataError(f"malformed JSONL line: {where}", location=where)


def _raise_on_bad_jsonl(
    files: Iterable[str], required: Mapping[str, str] | None, cause: BaseException | None = None
) -> None:
    files = [f for f in files if Path(f).suffix.lower() == ".jsonl"]
    where = find_bad_jsonl_line(files, required)
    if where is not None:
        raise DataError(f"malformed JSONL line: {where}", location=where) from cause


# ------------------------------------------------------------------------------------------------- columns


def column_names(ds: AnyDataset) -> list[str]:
    """Column names of a dataset; for a streaming dataset with unknown features, those of its first row."""
    if ds.column_names is not None:
        return list(ds.column_names)
    first = next(iter(ds), None)
    return list(first) if first is not None else []


def apply_fields(ds: AnyDataset, fields: Mapping[str, str], *, source: str) -> AnyDataset:
    """Rename the user's columns to canonical names and keep only canonical columns.

    A mapped column that does not exist raises, listing the columns found. A column already named canonically
    is kept unless a mapping targets the same canonical name (the mapping wins).
    """
    found = column_names(ds)
    missing = {canon: col for canon, col in fields.items() if col not in found}
    if missing:
        wanted = ", ".join(f"fields.{c}: {col!r}" for c, col in missing.items())
        raise DataError(
            f"{source}: {wanted} names a column that does not exist; columns found: {found}", path=source
        )
    if len(set(fields.values())) < len(fields):
        raise DataError(f"{source}: one column is mapped to two canonical fields: {fields}", path=source)
    keep = [c for c in found if c in CANONICAL_FIELDS and c not in fields] + list(fields.values())
    if not keep:
        raise DataError(
            f"{source}: none of roll's fields {list(CANONICAL_FIELDS)} is present; columns found: {found}. "
            f"Map your columns, e.g. `fields.prompt: {found[0] if found else '<column>'}`",
            path=source,
        )
    ds = ds.select_columns(keep)
    renames = {col: canon for canon, col in fields.items() if col != canon}
    return ds.rename_columns(renames) if renames else ds


def require_columns(ds: AnyDataset, *alternatives: Sequence[str], source: str = "dataset") -> tuple[str, ...]:
    """Return the first alternative whose columns are all present, else raise naming the mapping keys to set.

    ``require_columns(ds, ["messages"], ["prompt", "response"])`` accepts either a chat column or a
    prompt/response pair.
    """
    found = column_names(ds)
    for option in alternatives:
        if all(col in found for col in option):
            return tuple(option)
    needs = " or ".join("+".join(option) for option in alternatives)
    hint = "; ".join(
        ", ".join(f"`fields.{c}: <column>`" for c in option if c not in found) for option in alternatives
    )
    raise DataError(
        f"{source}: needs fields {needs}; columns found: {found}. Map your columns in the source config: {hint}",
        path=source,
        found=found,
    )


def ensure_not_empty(ds: datasets.Dataset, *, step: str, source: str) -> None:
    """Raise if ``ds`` has no rows, naming the step (filter) that emptied it."""
    if len(ds) == 0:
        raise DataError(f"{source}: no rows left after {step}", path=source, step=step)


# ------------------------------------------------------------------------------------ split, shuffle, mix


def unit_hash(seed: int, index: int) -> float:
    """A stateless uniform number in [0, 1) for ``(seed, index)`` (splitmix64), the same on every platform."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) / 2.0**64


def split_eval(ds: AnyDataset, fraction: float, *, seed: int, source: str) -> tuple[AnyDataset, AnyDataset]:
    """Split rows into ``(train, eval)``: row ``i`` is held out iff ``unit_hash(seed, i) < fraction``."""
    if isinstance(ds, datasets.IterableDataset):
        train = ds.filter(lambda _, i: unit_hash(seed, i) >= fraction, with_indices=True)
        held = ds.filter(lambda _, i: unit_hash(seed, i) < fraction, with_indices=True)
        return train, held
    held_mask = [unit_hash(seed, i) < fraction for i in range(len(ds))]
    train_ds = ds.select([i for i, h in enumerate(held_mask) if not h])
    eval_ds = ds.select([i for i, h in enumerate(held_mask) if h])
    ensure_not_empty(
        train_ds, step=f"holding out eval_fraction={fraction} (every row went to eval)", source=source
    )
    if len(eval_ds) == 0:
        log.warning("%s: eval_fraction=%s held out no rows of %d", source, fraction, len(ds))
    return train_ds, eval_ds


def _shuffled(ds: AnyDataset, cfg: DataConfig) -> AnyDataset:
    if isinstance(ds, datasets.IterableDataset):
        return ds.shuffle(seed=cfg.seed, buffer_size=cfg.shuffle_buffer)
    return ds.shuffle(seed=cfg.seed)


def mix(parts: Sequence[AnyDataset], weights: Sequence[float], *, seed: int, stopping: str) -> AnyDataset:
    """Interleave sources with probabilities proportional to ``weights``; one source is returned as is."""
    if len(parts) == 1:
        return parts[0]
    total = float(sum(weights))
    try:
        return datasets.interleave_datasets(
            list(parts), probabilities=[w / total for w in weights], seed=seed, stopping_strategy=stopping
        )
    except ValueError as exc:
        raise DataError(f"cannot mix sources: {exc}. {_schemas(parts)}") from exc


def _concat(parts: Sequence[AnyDataset], names: Sequence[str]) -> AnyDataset:
    if len(parts) == 1:
        return parts[0]
    try:
        return datasets.concatenate_datasets(list(parts))
    except ValueError as exc:
        raise DataError(f"cannot concatenate eval sources {list(names)}: {exc}. {_schemas(parts)}") from exc


def _schemas(parts: Sequence[AnyDataset]) -> str:
    lines = [
        f"source {i}: {dict(p.features) if p.features else column_names(p)}" for i, p in enumerate(parts)
    ]
    return "Sources must share columns and types; " + "; ".join(lines)
