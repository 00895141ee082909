"""The batch container that moves data between roll's stages and workers.

A :class:`Batch` holds three things:

- ``tensors``: arrays that all share the leading batch dimension ``B`` (``input_ids_BT``, ``rewards_B``): torch
  tensors, or numeric numpy arrays in a process that never imported torch (see below).
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

A process without torch (a driver, a reward worker) keeps the wire's numpy arrays as its tensor columns: unpickling
builds torch tensors only where torch is already imported, so a batch that passes through the driver never pulls
torch (~550 MB resident) into it, and an actor, which imports torch to run a model, gets torch tensors as before
(``torch.from_numpy``, no copy). Every operation here works on either kind; :meth:`Batch.to_torch` and
:meth:`Batch.to_numpy` convert explicitly. The one exception: a dtype numpy lacks (``bfloat16``) cannot be held
without torch, so unpickling one imports torch, with a warning that names the column.
"""

from __future__ import annotations

import copy
import logging
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from roll.core.errors import DataError

if TYPE_CHECKING:
    import torch

PAD_COLUMN = "is_pad_B"
"""Bool tensor column that :meth:`Batch.pad_to_multiple` adds: True on the rows it appended."""

Column: TypeAlias = "torch.Tensor | np.ndarray"
Array: TypeAlias = "torch.Tensor | np.ndarray"
"""A tensor column: a torch tensor, or a numeric numpy array where torch is not imported."""
Indices: TypeAlias = "torch.Tensor | Sequence[int] | np.ndarray"

# Dtypes without a numpy counterpart travel as an integer view of the same width.
_NUMPY_VIEW: dict[str, str] = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}
logger = logging.getLogger(__name__)


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
        tensors: Mapping[str, Array] | None = None,
        non_tensors: Mapping[str, Sequence[Any] | np.ndarray] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        # Typed as torch tensors, what code in a torch process sees; a process without torch holds numpy arrays
        # here (see the module docstring), and code that runs there reads them with numpy.
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})  # type: ignore[arg-type]
        for name, array in self.tensors.items():
            _check_array(name, array)
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
        """Add or replace a column. A torch tensor becomes a tensor column, and so does a numeric numpy array when
        the batch's tensor columns are numpy (a batch in a process without torch); anything else is a non-tensor
        column.

        The column must have ``len(self)`` rows, unless the batch has no columns yet (it then sets ``B``).
        """
        array = _is_torch(values) or (self._holds_numpy() and _is_numeric(values))
        column: Any = values if array else _as_object_column(name, values)  # type: ignore[arg-type]
        length = _column_length(name, column)
        if any(key != name for key in self.keys()) and length != self._size:
            raise DataError(f"column {name!r} has {length} rows, but the batch has {self._size}", column=name)
        if array:
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
        return self._build(
            {k: _take(v, index_B) for k, v in self.tensors.items()},
            {k: v[index_B] for k, v in self.non_tensors.items()},
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
        rows = np.arange(self._size)
        index_B = np.repeat(rows, n) if interleave else np.tile(rows, n)
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
        rows = np.concatenate([np.arange(self._size), (np.arange(pad) - pad) % max(self._size, 1)])
        padded = self.select(rows)
        is_pad_B = np.concatenate([np.zeros(self._size, dtype=bool), np.ones(pad, dtype=bool)])
        if PAD_COLUMN in self.tensors:
            is_pad_B[: self._size] = _to_numpy(self.tensors[PAD_COLUMN])
        torch = self._torch()
        if torch is None:
            padded.tensors[PAD_COLUMN] = is_pad_B  # type: ignore[assignment]
        else:
            device = next(iter(self.tensors.values())).device if self.tensors else torch.device("cpu")
            padded.tensors[PAD_COLUMN] = torch.from_numpy(is_pad_B).to(device)
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
        tensors = {k: _cat([b.tensors[k] for b in batches]) for k in first.tensors}
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
        """A batch whose tensors are torch tensors on ``device`` (numpy columns convert without a copy); non-tensor
        columns and meta are shared, not copied."""
        moved: dict[str, Array] = {
            k: v.to(device, non_blocking=non_blocking) for k, v in self.to_torch().tensors.items()
        }
        return self._build(moved, dict(self.non_tensors))

    def to_torch(self) -> Batch:
        """The same batch with every tensor column a torch tensor (numpy arrays via ``torch.from_numpy``, sharing
        memory). Imports torch."""
        return self._build({k: _as_torch(v) for k, v in self.tensors.items()}, dict(self.non_tensors))

    def to_numpy(self) -> Batch:
        """The same batch with every tensor column a numpy array (CPU tensors share memory; ``bfloat16`` and the
        other dtypes numpy lacks raise :class:`DataError`)."""
        return self._build({k: _to_numpy(v, k) for k, v in self.tensors.items()}, dict(self.non_tensors))

    def clone(self) -> Batch:
        """A deep copy whose tensors own writable memory (see the module docstring on ``ray.get``)."""
        cloned = self._build({k: _clone(v) for k, v in self.tensors.items()}, copy.deepcopy(self.non_tensors))
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
        self.tensors = {name: _tensor_from_wire(name, *wire) for name, wire in state["tensors"].items()}  # type: ignore[misc]
        self.non_tensors = state["non_tensors"]
        self.meta = state["meta"]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_empty_batch, (), self.__getstate__())

    # ---------------------------------------------------------------------------------------------- helpers

    def _build(self, tensors: dict[str, Array], non_tensors: dict[str, np.ndarray]) -> Batch:
        """A batch from already validated columns, keeping ``meta`` (copied, so edits do not leak back)."""
        built = _empty_batch()
        built.tensors, built.non_tensors, built.meta = tensors, non_tensors, dict(self.meta)  # type: ignore[assignment]
        built._size = _common_length(tensors, non_tensors) if tensors or non_tensors else 0
        return built

    def _check_indices(self, indices: Indices) -> np.ndarray:
        """``indices`` as a 1-D int64 numpy array of non-negative row numbers."""
        index_B = _to_numpy(indices) if _is_torch(indices) else np.asarray(indices)
        index_B = index_B.reshape(-1) if index_B.size else np.zeros(0, dtype=np.int64)
        if not np.issubdtype(index_B.dtype, np.integer):
            raise DataError(f"select needs integer indices, got dtype {_dtype_name(index_B.dtype)}")
        out_of_range = index_B[(index_B >= self._size) | (index_B < -self._size)]
        if out_of_range.size:
            raise DataError(f"index {int(out_of_range[0])} is out of range for a batch of {self._size} rows")
        return index_B.astype(np.int64) % max(self._size, 1)

    def _holds_numpy(self) -> bool:
        return bool(self.tensors) and not any(_is_torch(v) for v in self.tensors.values())

    def _torch(self) -> Any:
        """torch when this batch's new tensor columns should be torch tensors: it has a torch column, or it has no
        tensor column and torch is imported. ``None``: numpy."""
        if any(_is_torch(v) for v in self.tensors.values()):
            return sys.modules["torch"]
        return None if self.tensors else sys.modules.get("torch")

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


def _common_length(tensors: Mapping[str, Array], non_tensors: Mapping[str, np.ndarray]) -> int:
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
        if _dtype_name(theirs.dtype) != _dtype_name(tensor.dtype) or theirs.shape[1:] != tensor.shape[1:]:
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
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) or _is_torch(a) or _is_torch(b):
        return _columns_equal(a, b)
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return a is b


def _columns_equal(a: Any, b: Any) -> bool:
    if _is_torch(a) and _is_torch(b):
        return bool(
            a.dtype == b.dtype and a.shape == b.shape and sys.modules["torch"].equal(a.cpu(), b.cpu())
        )
    if _is_torch(a) != _is_torch(b) and _is_numeric(a) and _is_numeric(b):  # one side torch, one numpy
        a, b = _to_numpy(a), _to_numpy(b)
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape == b.shape and all(_values_equal(x, y) for x, y in zip(a.tolist(), b.tolist()))
    return False


def _dtype_name(dtype: Any) -> str:
    """``float32``, ``int64``, ``bool``, ``bfloat16``: one name for a torch and a numpy dtype alike."""
    return str(dtype).removeprefix("torch.")


# ------------------------------------------------------------------------------------- torch or numpy columns


def _is_torch(value: object) -> bool:
    """Whether ``value`` is a torch tensor, without importing torch (a process without torch has none)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_numeric(value: object) -> bool:
    return _is_torch(value) or (isinstance(value, np.ndarray) and value.dtype.kind in "biuf")


def _check_array(name: str, array: object) -> None:
    if not _is_numeric(array):
        kind = (
            f"numpy array of dtype {array.dtype}" if isinstance(array, np.ndarray) else type(array).__name__
        )
        raise DataError(
            f"tensor column {name!r} must be a torch tensor or a numeric numpy array, got a {kind}; "
            "put per-row Python objects in non_tensors",
            column=name,
        )


def _take(array: Array, index_B: np.ndarray) -> Array:
    if _is_torch(array):
        return array[sys.modules["torch"].from_numpy(index_B).to(array.device)]
    return array[index_B]


def _cat(arrays: list[Array]) -> Array:
    """Concatenate along rows; a column that is torch in any part comes out torch."""
    if any(_is_torch(a) for a in arrays):
        cat: torch.Tensor = sys.modules["torch"].cat([_as_torch(a) for a in arrays])
        return cat
    return np.concatenate(arrays)


def _clone(array: Array) -> Array:
    return array.clone() if _is_torch(array) else np.array(array, copy=True)  # type: ignore[union-attr]


def _as_torch(array: Array) -> torch.Tensor:
    import torch

    if isinstance(array, torch.Tensor):
        return array
    with warnings.catch_warnings():
        # Ray hands back read-only arrays; sharing them is the point (see the module docstring).
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def _to_numpy(array: Any, name: str = "") -> np.ndarray:
    if not _is_torch(array):
        return np.asarray(array)
    if _dtype_name(array.dtype) in _NUMPY_VIEW:
        raise DataError(f"column {name!r} is {_dtype_name(array.dtype)}, which numpy lacks; keep it in torch")
    return np.asarray(array.detach().cpu().numpy())


def _tensor_to_wire(array: Array) -> tuple[np.ndarray, str, tuple[int, ...]]:
    """A contiguous CPU numpy array with the column's bytes, plus what it takes to rebuild it."""
    if not _is_torch(array):
        return np.ascontiguousarray(array), _dtype_name(array.dtype), tuple(array.shape)
    torch = sys.modules["torch"]
    flat = array.detach().cpu().contiguous()  # type: ignore[union-attr]
    view_dtype = _NUMPY_VIEW.get(_dtype_name(flat.dtype))
    wire = (flat.view(getattr(torch, view_dtype)) if view_dtype is not None else flat).numpy()
    return wire, _dtype_name(array.dtype), tuple(array.shape)


def _tensor_from_wire(name: str, array: np.ndarray, dtype_name: str, shape: tuple[int, ...]) -> Array:
    """A torch tensor where torch is imported, else the numpy array itself (see the module docstring)."""
    if "torch" not in sys.modules:
        if dtype_name not in _NUMPY_VIEW:
            return array.reshape(shape)
        logger.warning("column %r is %s, which numpy lacks: importing torch to hold it", name, dtype_name)
    import torch

    tensor = _as_torch(array)
    dtype = getattr(torch, dtype_name)
    if tensor.dtype != dtype:
        tensor = tensor.view(dtype)
    return tensor.reshape(shape)


def as_column(values: Any, dtype: str) -> Array:
    """A new tensor column of ``dtype`` (``"float32"``, ``"int64"``, ``"bool"``) from a list or array, of this
    process's kind: a torch tensor where torch is imported, else a numpy array (see the module docstring). The
    values convert through numpy in both cases, so they round alike."""
    array = np.asarray(values, dtype=dtype)
    torch = sys.modules.get("torch")
    return array if torch is None else torch.from_numpy(array)


__all__ = ["PAD_COLUMN", "Array", "Batch", "Column", "Indices", "MissingColumnError", "as_column"]
