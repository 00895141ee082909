"""The batch container that moves data between roll's stages and workers.

A :class:`Batch` holds three things:

- ``tensors``: torch tensors that all share the leading batch dimension ``B`` (``input_ids_BT``, ``rewards_B``).
- ``non_tensors``: per-row Python objects (prompts, ground truths, tags, dicts) as 1-D numpy arrays of length
  ``B``; lists are converted to ``object`` arrays so indexing works the same for every column.
- ``meta``: batch-wide facts (``step``, ``policy_version``, ...) that are not per row.

Every operation that selects rows (:meth:`Batch.select`, :meth:`Batch.slice`, :meth:`Batch.chunk`,
:meth:`Batch.repeat`, ...) returns a new batch and keeps ``meta``. Column names carry their axes as capital
letters (B batch, G group, P prompts, T tokens, V vocab).

Sending a batch through Ray: pickling turns each tensor into a contiguous numpy array (dtypes numpy lacks, such
as ``bfloat16``, travel as a same-width integer view), because Ray stores numpy arrays out of band and hands them
back without a copy, while a pickled torch tensor is copied into the pickle stream and again out of it. Tensors
travel on the CPU; call :meth:`Batch.to` after receiving. A batch fetched with ``ray.get`` shares the object
store's memory, which Ray marks read-only: call :meth:`Batch.clone` before writing into its tensors in place.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
import torch

from roll.core.errors import DataError

PAD_COLUMN = "is_pad_B"
"""Bool tensor column that :meth:`Batch.pad_to_multiple` adds: True on the rows it appended."""

Column: TypeAlias = torch.Tensor | np.ndarray
Indices: TypeAlias = torch.Tensor | Sequence[int] | np.ndarray

# Dtypes without a numpy counterpart travel as an integer view of the same width.
_NUMPY_VIEW: dict[torch.dtype, torch.dtype] = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
}


class MissingColumnError(DataError, KeyError):
    """A column name that the batch does not have. Lists the columns it does have."""


class Batch:
    """Tensor columns, non-tensor columns and meta, all rows sharing the leading batch dimension ``B``.

    Construction validates that every column has ``B`` rows and raises :class:`DataError` naming the column and
    the lengths otherwise. A batch with no columns has ``B == 0``. Column names are unique across tensors and
    non-tensors.
    """

    __slots__ = ("_size", "meta", "non_tensors", "tensors")

    def __init__(
        self,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Sequence[Any] | np.ndarray] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})
        self.non_tensors: dict[str, np.ndarray] = {
            name: _as_object_column(name, values) for name, values in (non_tensors or {}).items()
        }
        self.meta: dict[str, Any] = dict(meta or {})
        self._size = _common_length(self.tensors, self.non_tensors)

    # ----------------------------------------------------------------------------------------------- mapping

    def __len__(self) -> int:
        return self._size

    def __contains__(self, name: object) -> bool:
        return name in self.tensors or name in self.non_tensors

    def __getitem__(self, name: str) -> Column:
        if name in self.tensors:
            return self.tensors[name]
        if name in self.non_tensors:
            return self.non_tensors[name]
        raise MissingColumnError(f"batch has no column {name!r}; columns: {self._column_list()}", column=name)

    def __setitem__(self, name: str, values: torch.Tensor | Sequence[Any] | np.ndarray) -> None:
        """Add or replace a column. A tensor becomes a tensor column; anything else a non-tensor column.

        The column must have ``len(self)`` rows, unless the batch has no columns yet (it then sets ``B``).
        """
        column = values if isinstance(values, torch.Tensor) else _as_object_column(name, values)
        length = _column_length(name, column)
        if any(key != name for key in self.keys()) and length != self._size:
            raise DataError(f"column {name!r} has {length} rows, but the batch has {self._size}", column=name)
        if isinstance(column, torch.Tensor):
            self.non_tensors.pop(name, None)
            self.tensors[name] = column
        else:
            self.tensors.pop(name, None)
            self.non_tensors[name] = column
        self._size = length

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def keys(self) -> list[str]:
        """Tensor column names, then non-tensor column names, each in insertion order."""
        return [*self.tensors, *self.non_tensors]

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {_dtype_name(v.dtype)}{list(v.shape)}" for k, v in self.tensors.items())
        objects = ", ".join(f"{k}: {v.dtype}[{len(v)}]" for k, v in self.non_tensors.items())
        return f"Batch(B={self._size}, tensors={{{tensors}}}, non_tensors={{{objects}}}, meta={self.meta!r})"

    # ------------------------------------------------------------------------------------------ row selection

    def select(self, indices: Indices) -> Batch:
        """Rows at ``indices`` (any order, repeats allowed) as a new batch; ``meta`` is copied.

        ``indices`` is a 1-D integer tensor, numpy array or sequence; negative indices count from the end.
        """
        index_B = self._check_indices(indices)
        index_np = index_B.numpy()
        return self._build(
            {k: v[index_B.to(v.device)] for k, v in self.tensors.items()},
            {k: v[index_np] for k, v in self.non_tensors.items()},
        )

    def slice(self, start: int, stop: int | None = None) -> Batch:
        """Rows ``start:stop`` as a new batch, with Python slice semantics. Tensors are views, not copies."""
        rows = slice(start, stop)
        return self._build(
            {k: v[rows] for k, v in self.tensors.items()}, {k: v[rows] for k, v in self.non_tensors.items()}
        )

    def chunk(self, n: int) -> list[Batch]:
        """Split into ``n`` batches of ``len(self) // n`` rows each.

        Raises :class:`DataError` when the rows do not split evenly, with the arithmetic and the fix
        (:meth:`pad_to_multiple`), because data-parallel workers must receive equal shares.
        """
        if n < 1:
            raise DataError(f"chunk count must be >= 1, got {n}")
        if self._size % n:
            pad = n - self._size % n
            raise DataError(
                f"cannot chunk a batch of {self._size} rows into {n} equal parts: "
                f"{self._size} % {n} = {self._size % n}; call pad_to_multiple({n}) first (adds {pad} rows)"
            )
        return self.split([self._size // n] * n)

    def split(self, sizes: Sequence[int]) -> list[Batch]:
        """Consecutive batches of the given sizes, which must be >= 0 and sum to ``len(self)``."""
        if any(size < 0 for size in sizes) or sum(sizes) != self._size:
            raise DataError(f"split sizes {list(sizes)} must be >= 0 and sum to the batch size {self._size}")
        parts: list[Batch] = []
        start = 0
        for size in sizes:
            parts.append(self.slice(start, start + size))
            start += size
        return parts

    def repeat(self, n: int, *, interleave: bool = True) -> Batch:
        """Each row ``n`` times: ``interleave=True`` gives a,a,b,b (samples per prompt stay adjacent, the layout
        group-relative advantages expect); ``interleave=False`` gives a,b,a,b."""
        if n < 1:
            raise DataError(f"repeat count must be >= 1, got {n}")
        rows = torch.arange(self._size)
        index_B = rows.repeat_interleave(n) if interleave else rows.repeat(n)
        return self.select(index_B)

    def pad_to_multiple(self, k: int) -> tuple[Batch, int]:
        """Append rows so that the size is a multiple of ``k``; return the padded batch and the pad count.

        The padding repeats the last rows of the batch (cycling through the batch when more pad rows are needed
        than it has), so workers see real, well-formed samples. Column :data:`PAD_COLUMN` marks the appended rows
        with True (existing rows keep their mark, so padding twice composes). After a data-parallel gather the
        pad rows are at the end again: drop them with :meth:`unpad`.
        """
        if k < 1:
            raise DataError(f"pad multiple must be >= 1, got {k}")
        pad = -self._size % k
        device = next(iter(self.tensors.values())).device if self.tensors else torch.device("cpu")
        is_pad_B = self.tensors.get(PAD_COLUMN, torch.zeros(self._size, dtype=torch.bool, device=device))
        rows = torch.cat([torch.arange(self._size), (torch.arange(pad) - pad) % self._size])
        padded = self.select(rows)
        pad_B = torch.ones(pad, dtype=torch.bool, device=is_pad_B.device)
        padded[PAD_COLUMN] = torch.cat([is_pad_B, pad_B])
        return padded, pad

    def unpad(self, n: int) -> Batch:
        """Drop the last ``n`` rows, which :meth:`pad_to_multiple` appended.

        When the batch has :data:`PAD_COLUMN`, the dropped rows must be marked as padding (otherwise real data
        would be lost, which means ``n`` or the row order is wrong); the column is removed when no padding is left.
        """
        if not 0 <= n <= self._size:
            raise DataError(f"cannot unpad {n} rows from a batch of {self._size}")
        kept = self.slice(0, self._size - n)
        if PAD_COLUMN not in self.tensors:
            return kept
        dropped_B = self.tensors[PAD_COLUMN][self._size - n :]
        if not bool(dropped_B.all()):
            real = int((~dropped_B).sum())
            raise DataError(f"unpad({n}) would drop {real} rows not marked in {PAD_COLUMN!r}")
        if not bool(kept.tensors[PAD_COLUMN].any()):
            del kept.tensors[PAD_COLUMN]
        return kept

    # -------------------------------------------------------------------------------------------- combining

    @classmethod
    def concat(cls, batches: Sequence[Batch]) -> Batch:
        """Rows of all ``batches`` in order. They must have the same columns, each with the same dtype and
        trailing shape; ``meta`` dicts are merged, and a key with different values in two batches is an error."""
        if not batches:
            raise DataError("concat needs at least one batch")
        first = batches[0]
        for i, other in enumerate(batches[1:], start=1):
            _check_same_columns(first, other, i)
        meta = _merge_meta([b.meta for b in batches])
        tensors = {k: torch.cat([b.tensors[k] for b in batches]) for k in first.tensors}
        objects = {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in first.non_tensors}
        return cls(tensors, objects, meta)

    def union(self, other: Batch) -> Batch:
        """Columns of both batches (same number of rows). A column present in both must hold equal values;
        ``meta`` is merged as in :meth:`concat`."""
        if len(other) != self._size:
            raise DataError(f"cannot union batches of {self._size} and {len(other)} rows")
        for name in set(self.keys()) & set(other.keys()):
            if not _columns_equal(self[name], other[name]):
                raise DataError(f"cannot union: column {name!r} is in both batches with different values")
        meta = _merge_meta([self.meta, other.meta])
        return Batch({**self.tensors, **other.tensors}, {**self.non_tensors, **other.non_tensors}, meta)

    # ---------------------------------------------------------------------------------------------- columns

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        """A batch whose tensors live on ``device``; non-tensor columns and meta are shared, not copied."""
        moved = {k: v.to(device, non_blocking=non_blocking) for k, v in self.tensors.items()}
        return self._build(moved, dict(self.non_tensors))

    def clone(self) -> Batch:
        """A deep copy whose tensors own writable memory (see the module docstring on ``ray.get``)."""
        cloned = self._build({k: v.clone() for k, v in self.tensors.items()}, copy.deepcopy(self.non_tensors))
        cloned.meta = copy.deepcopy(self.meta)
        return cloned

    def rename(self, mapping: Mapping[str, str]) -> Batch:
        """A batch with columns renamed ``old -> new``; order is kept. Unknown or clashing names raise."""
        missing = [old for old in mapping if old not in self]
        if missing:
            raise MissingColumnError(
                f"cannot rename missing columns {missing}; columns: {self._column_list()}", column=missing[0]
            )
        renamed = [mapping.get(name, name) for name in self.keys()]
        clashes = sorted({name for name in renamed if renamed.count(name) > 1})
        if clashes:
            raise DataError(f"rename {dict(mapping)} would give duplicate columns {clashes}")
        return self._build(
            {mapping.get(k, k): v for k, v in self.tensors.items()},
            {mapping.get(k, k): v for k, v in self.non_tensors.items()},
        )

    def pop(self, *names: str) -> Batch:
        """Remove ``names`` from this batch and return them as a new batch (with a copy of ``meta``)."""
        missing = [name for name in names if name not in self]
        if missing:
            raise MissingColumnError(
                f"cannot pop missing columns {missing}; columns: {self._column_list()}", column=missing[0]
            )
        tensors = {k: self.tensors.pop(k) for k in names if k in self.tensors}
        objects = {k: self.non_tensors.pop(k) for k in names if k in self.non_tensors}
        popped = Batch(tensors, objects, self.meta)
        popped._size = self._size
        return popped

    # --------------------------------------------------------------------------------------------- pickling

    def __getstate__(self) -> dict[str, Any]:
        """Tensors as ``(numpy array, torch dtype name, shape)``; see the module docstring for why."""
        return {
            "size": self._size,
            "tensors": {name: _tensor_to_wire(t) for name, t in self.tensors.items()},
            "non_tensors": self.non_tensors,
            "meta": self.meta,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._size = state["size"]
        self.tensors = {name: _tensor_from_wire(*wire) for name, wire in state["tensors"].items()}
        self.non_tensors = state["non_tensors"]
        self.meta = state["meta"]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_empty_batch, (), self.__getstate__())

    # ---------------------------------------------------------------------------------------------- helpers

    def _build(self, tensors: dict[str, torch.Tensor], non_tensors: dict[str, np.ndarray]) -> Batch:
        """A batch from already validated columns, keeping ``meta`` (copied, so edits do not leak back)."""
        built = _empty_batch()
        built.tensors, built.non_tensors, built.meta = tensors, non_tensors, dict(self.meta)
        built._size = _common_length(tensors, non_tensors) if tensors or non_tensors else 0
        return built

    def _check_indices(self, indices: Indices) -> torch.Tensor:
        index_B = torch.as_tensor(np.asarray(indices) if not isinstance(indices, torch.Tensor) else indices)
        index_B = index_B.reshape(-1).cpu() if index_B.numel() else torch.zeros(0, dtype=torch.long)
        if index_B.is_floating_point() or index_B.dtype == torch.bool:
            raise DataError(f"select needs integer indices, got dtype {_dtype_name(index_B.dtype)}")
        out_of_range = index_B[(index_B >= self._size) | (index_B < -self._size)]
        if out_of_range.numel():
            raise DataError(f"index {int(out_of_range[0])} is out of range for a batch of {self._size} rows")
        return index_B.long() % max(self._size, 1)

    def _column_list(self) -> str:
        return ", ".join(self.keys()) or "(none)"


def _empty_batch() -> Batch:
    batch = Batch.__new__(Batch)
    batch.tensors, batch.non_tensors, batch.meta, batch._size = {}, {}, {}, 0
    return batch


def _as_object_column(name: str, values: Sequence[Any] | np.ndarray) -> np.ndarray:
    """A 1-D numpy array. Lists become ``object`` arrays element by element, so a list of lists stays 1-D."""
    if isinstance(values, np.ndarray):
        if values.ndim == 0:
            raise DataError(f"column {name!r} is a 0-d array; a column needs one entry per row", column=name)
        return values
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise DataError(
            f"column {name!r} must be a tensor, numpy array or list, got {type(values).__name__}", column=name
        )
    items = list(values)
    column = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        column[i] = item  # element-wise, so numpy does not broadcast nested sequences into extra axes
    return column


def _column_length(name: str, column: Column) -> int:
    if column.ndim == 0:
        raise DataError(
            f"column {name!r} is 0-dimensional; a column needs a leading batch dimension", column=name
        )
    return int(column.shape[0])


def _common_length(tensors: Mapping[str, torch.Tensor], non_tensors: Mapping[str, np.ndarray]) -> int:
    """The shared row count, or a DataError naming the first column that disagrees with the first column."""
    duplicated = sorted(set(tensors) & set(non_tensors))
    if duplicated:
        raise DataError(f"columns {duplicated} are given both as tensors and as non-tensors")
    columns: dict[str, Column] = {**tensors, **non_tensors}
    lengths = {name: _column_length(name, col) for name, col in columns.items()}
    if not lengths:
        return 0
    first, size = next(iter(lengths.items()))
    for name, length in lengths.items():
        if length != size:
            raise DataError(
                f"column {name!r} has {length} rows, but column {first!r} has {size}; "
                "every column must share the leading batch dimension",
                column=name,
            )
    return size


def _check_same_columns(first: Batch, other: Batch, position: int) -> None:
    if set(first.tensors) != set(other.tensors) or set(first.non_tensors) != set(other.non_tensors):
        raise DataError(
            f"cannot concat: batch {position} has columns {sorted(other.keys())}, "
            f"batch 0 has {sorted(first.keys())}"
        )
    for name, tensor in first.tensors.items():
        theirs = other.tensors[name]
        if theirs.dtype != tensor.dtype or theirs.shape[1:] != tensor.shape[1:]:
            raise DataError(
                f"cannot concat column {name!r}: batch 0 has {_dtype_name(tensor.dtype)}"
                f"[B, {', '.join(map(str, tensor.shape[1:]))}], batch {position} has "
                f"{_dtype_name(theirs.dtype)}[B, {', '.join(map(str, theirs.shape[1:]))}]"
            )


def _merge_meta(metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for meta in metas:
        for key, value in meta.items():
            if key in merged and not _values_equal(merged[key], value):
                raise DataError(f"conflicting meta {key!r}: {merged[key]!r} vs {value!r}")
            merged.setdefault(key, value)
    return merged


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor | np.ndarray) or isinstance(b, torch.Tensor | np.ndarray):
        return _columns_equal(a, b)
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return a is b


def _columns_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape == b.shape and all(_values_equal(x, y) for x, y in zip(a.tolist(), b.tolist()))
    return False


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor_to_wire(tensor: torch.Tensor) -> tuple[np.ndarray, str, tuple[int, ...]]:
    """A contiguous CPU numpy array with the tensor's bytes, plus what it takes to rebuild the tensor."""
    flat = tensor.detach().cpu().contiguous()
    view_dtype = _NUMPY_VIEW.get(flat.dtype)
    array = (flat.view(view_dtype) if view_dtype is not None else flat).numpy()
    return array, _dtype_name(tensor.dtype), tuple(tensor.shape)


def _tensor_from_wire(array: np.ndarray, dtype_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    dtype = getattr(torch, dtype_name)
    with warnings.catch_warnings():
        # Ray hands back read-only arrays; sharing them is the point (see the module docstring).
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(array)
    if tensor.dtype != dtype:
        tensor = tensor.view(dtype)
    return tensor.reshape(shape)


__all__ = ["PAD_COLUMN", "Batch", "Column", "Indices", "MissingColumnError"]
