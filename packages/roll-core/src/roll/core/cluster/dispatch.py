"""How a call on a Cluster becomes calls on its ranks, and how their answers become one result.

A Worker method is marked with :func:`register`, which stores a :class:`MethodSpec` on the function object (the
attribute :data:`SPEC_ATTR`). :class:`~roll.core.cluster.cluster.Cluster` finds these markers by inspecting the
worker class, so nobody binds methods by name. Each :class:`Dispatch` mode maps, in :data:`RULES`, to two plain
functions: ``split`` (the cluster call's arguments -> a :class:`CallPlan` with per-rank arguments) and ``collect``
(per-rank results -> one value).

- ``ONE_TO_ALL``: every rank gets the same arguments; the result is the list of per-rank results, by rank.
- ``DP_SPLIT``: the first positional argument is split across ranks (other arguments go to every rank). It must be
  a :class:`Shardable` (``roll.core.batch.Batch`` is one) or a list. It is first padded to a multiple of the world
  size, so every rank gets the same number of rows (collectives inside the method need equal shapes), and the
  padding is removed again from the gathered result. Results that are Shardables are joined with ``concat``
  (a Batch result with a different row count than was sent, e.g. ``n`` samples per prompt, must carry the
  ``is_pad_B`` column copied from its input rows: the marked rows are dropped),
  lists by list concatenation, anything else comes back as the per-rank list (padding cannot be removed from
  those; a method that returns per-rank metrics should expect the padded rows to have been seen).
- ``RANK_ZERO``: only rank 0 is called; the result is its result.
- ``MP_SPLIT``: for model-parallel groups (Megatron's tensor x context x data x pipeline parallel ranks, laid out
  by a :class:`Mesh`). The first positional argument is split into ``mesh.dp`` shards exactly as ``DP_SPLIT``
  splits it over ranks; every rank is called, each with the shard of its DP rank (its TP/CP/PP peers get the
  same shard: they work on the same rows); results are collected from one rank per DP group (TP rank 0, CP rank
  0, the last pipeline stage, where the loss and log-probs live), in DP order, and joined like ``DP_SPLIT``'s.
  With a pure data-parallel mesh (``tp = pp = cp = 1``) it is ``DP_SPLIT``.

A rule's ``split`` takes the cluster's :class:`Mesh` (``Mesh(world_size)`` unless the role has model
parallelism); the modes other than ``MP_SPLIT`` read only its ``world_size``.

Parts: a worker class composes its methods from objects it holds instead of inheriting them. It declares them in
the class attribute :data:`PARTS_ATTR` (``parts``), a mapping from the attribute that holds each part to the part's
class, and sets those attributes in ``__init__``::

    class ActorTrainWorker(Worker):
        parts: ClassVar[Mapping[str, type]] = {"trainer": PolicyTrainer, "sender": WeightSender}

        def __init__(self, ctx: WorkerContext, spec: TrainerSpec) -> None:
            super().__init__(ctx)
            self.trainer = PolicyTrainer(self, spec)
            self.sender = WeightSender(self, lambda: self.trainer.strategy)

The :func:`register`-marked methods of each part's class are the worker's cluster methods as well
(:func:`registered_methods` lists them with the class's own; :func:`part_methods` says which part holds which),
called by name exactly like the class's own (``cluster.stage_weights(...)``). A name may have one owner only: a
method registered by two parts, or by a part and the class itself, is a ``TypeError`` when the class is defined,
naming both; parts do not nest (a part's class declares no parts). How the actor reaches a part's method: see
:mod:`roll.core.cluster.worker`.

Overrides: a class replaces one of its parts' methods only when it says so, with ``@register(mode,
overrides=True)`` on its own method of that name; the cluster then calls the class's method, and the part's stays
an ordinary Python method the class may call (``self.trainer.setup()``)::

    class HybridActorWorker(Worker):
        parts: ClassVar[Mapping[str, type]] = {"trainer": PolicyTrainer, "sender": WeightSender}

        @register(Dispatch.ONE_TO_ALL, overrides=True)
        def setup(self) -> None:
            self.trainer.setup()  # the part's, then what the class adds
            ...

Every other clash stays a ``TypeError`` when the class is defined: a registered method without the marker, a
method of the part's name that is not registered at all (the cluster would call the part's and never it), and a
marker that overrides nothing (no part registers the name; a part's own method cannot override). Keep an
override's signature and dispatch mode those of the part's method, so a typed handle of the class can subclass
the part's (``scripts/gen_cluster_handles.py`` declares an override in the class's handle only when its type
differs); :func:`overridden_methods` says which part's method each override replaces.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import (
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    Self,
    TypeVar,
    overload,
    runtime_checkable,
)

from roll.core.errors import ConfigError, WorkerError

__all__ = [
    "PARTS_ATTR",
    "RULES",
    "SPEC_ATTR",
    "CallPlan",
    "Dispatch",
    "DispatchRule",
    "Mesh",
    "MethodSpec",
    "ModelParallel",
    "OnAllRanks",
    "OnRankZero",
    "OnShards",
    "Registered",
    "Shardable",
    "declared_parts",
    "get_spec",
    "overridden_methods",
    "part_methods",
    "register",
    "registered_functions",
    "registered_methods",
]

SPEC_ATTR = "__roll_dispatch__"
PARTS_ATTR = "parts"
"""The class attribute that declares a worker's parts (see the module docstring)."""
_PAD_COLUMN = "is_pad_B"  # roll.core.batch.PAD_COLUMN; this module imports no torch

P = ParamSpec("P")
R = TypeVar("R")
W = TypeVar("W")
Args = tuple[tuple[Any, ...], dict[str, Any]]


class Dispatch(enum.Enum):
    """How a registered method is spread over a Cluster's ranks. See the module docstring."""

    ONE_TO_ALL = "one_to_all"
    DP_SPLIT = "dp_split"
    RANK_ZERO = "rank_zero"
    MP_SPLIT = "mp_split"


@dataclass(frozen=True)
class Mesh:
    """How a role's ``world_size`` ranks form tensor (``tp``), context (``cp``), data (``dp``) and pipeline
    (``pp``) parallel groups, in Megatron-Core's default order (``tp-cp-ep-dp-pp``, tensor parallel fastest)::

        rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

    e.g. world 4 with ``tp=2``: ranks 0, 1 are DP rank 0 (TP ranks 0, 1) and ranks 2, 3 are DP rank 1, so
    ``collect_ranks() == (0, 2)``. With ``pp=2`` as well (world 8, dp 2) the last stage holds ranks 4..7 and
    ``collect_ranks() == (4, 6)``.
    """

    world_size: int
    tp: int = 1
    pp: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        sizes = {"world_size": self.world_size, "tp": self.tp, "pp": self.pp, "cp": self.cp}
        bad = {k: v for k, v in sizes.items() if not (isinstance(v, int) and v >= 1)}
        if bad:
            raise ConfigError(f"Mesh sizes must be integers >= 1; got {bad}")
        if self.world_size % (self.tp * self.pp * self.cp):
            raise ConfigError(
                f"a role of {self.world_size} workers cannot hold tensor x pipeline x context parallel groups of "
                f"{self.tp} x {self.pp} x {self.cp} = {self.tp * self.pp * self.cp} ranks: num_workers must be "
                "a multiple of tensor_parallel_size * pipeline_parallel_size"
            )

    @property
    def dp(self) -> int:
        """The data-parallel size: what the model-parallel groups leave of the world."""
        return self.world_size // (self.tp * self.pp * self.cp)

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """``(tp_rank, cp_rank, dp_rank, pp_rank)`` of global ``rank``."""
        if not 0 <= rank < self.world_size:
            raise IndexError(f"rank {rank} is outside a mesh of {self.world_size} ranks")
        tp_rank, rest = rank % self.tp, rank // self.tp
        cp_rank, rest = rest % self.cp, rest // self.cp
        dp_rank, pp_rank = rest % self.dp, rest // self.dp
        return tp_rank, cp_rank, dp_rank, pp_rank

    def dp_rank(self, rank: int) -> int:
        return self.coords(rank)[2]

    def rank_of(self, *, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """The global rank at the given coordinates (inverse of :meth:`coords`)."""
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def collect_ranks(self) -> tuple[int, ...]:
        """One rank per DP group, by DP rank: TP and CP rank 0 of the last pipeline stage."""
        return tuple(self.rank_of(dp=d, pp=self.pp - 1) for d in range(self.dp))

    @classmethod
    def for_role(cls, role_cfg: Any) -> Mesh:
        """The mesh of a role config: its strategy's ``parallel_sizes()`` when the strategy is
        :class:`ModelParallel` (Megatron's is), else pure data parallelism over ``num_workers``."""
        strategy = getattr(role_cfg, "strategy", None)
        if isinstance(strategy, ModelParallel):
            tp, pp, cp = strategy.parallel_sizes()
            return cls(role_cfg.num_workers, tp=tp, pp=pp, cp=cp)
        return cls(role_cfg.num_workers)


@runtime_checkable
class ModelParallel(Protocol):
    """A strategy config with model parallelism: ``parallel_sizes()`` is ``(tp, pp, cp)``."""

    def parallel_sizes(self) -> tuple[int, int, int]: ...


@dataclass(frozen=True)
class MethodSpec:
    """What :func:`register` records: the dispatch mode, the method's own timeout (None: the role's) and whether it
    replaces a part's method of the same name (see the module docstring)."""

    mode: Dispatch
    timeout_s: float | None = None
    overrides: bool = False


class Registered(Generic[W, P, R]):
    """How the type checker sees a method of worker ``W`` marked with :func:`register`: on an instance (inside the
    actor) it is the plain bound method; on the class it carries its dispatch mode (the subclasses below), from
    which :func:`roll.core.cluster.cluster.on_cluster` derives what a call on the whole cluster returns. At run
    time :func:`register` returns the function itself: this class is never instantiated."""

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, obj: W, owner: type[Any]) -> Callable[P, R]: ...
    def __get__(self, obj: W | None, owner: type[Any]) -> Self | Callable[P, R]:
        raise NotImplementedError  # a typing view; see the class docstring

    def __call__(self, worker: W, /, *args: P.args, **kwargs: P.kwargs) -> R:
        raise NotImplementedError


class OnAllRanks(Registered[W, P, R]):
    """A ``ONE_TO_ALL`` method: the cluster call returns ``list[R]``, by rank."""


class OnRankZero(Registered[W, P, R]):
    """A ``RANK_ZERO`` method: the cluster call returns rank 0's ``R``."""


class OnShards(Registered[W, P, R]):
    """A ``DP_SPLIT`` or ``MP_SPLIT`` method: a Shardable or list ``R`` comes back joined, anything else as the list
    of per-rank (per-DP-group) results."""


Marker = Callable[[Callable[Concatenate[W, P], R]], Registered[W, P, R]]


@overload
def register(
    mode: Literal[Dispatch.RANK_ZERO], *, timeout_s: float | None = None, overrides: bool = False
) -> Callable[[Callable[Concatenate[W, P], R]], OnRankZero[W, P, R]]: ...
@overload
def register(
    mode: Literal[Dispatch.DP_SPLIT, Dispatch.MP_SPLIT],
    *,
    timeout_s: float | None = None,
    overrides: bool = False,
) -> Callable[[Callable[Concatenate[W, P], R]], OnShards[W, P, R]]: ...
@overload
def register(
    mode: Literal[Dispatch.ONE_TO_ALL] = ..., *, timeout_s: float | None = None, overrides: bool = False
) -> Callable[[Callable[Concatenate[W, P], R]], OnAllRanks[W, P, R]]: ...
def register(
    mode: Dispatch = Dispatch.ONE_TO_ALL, *, timeout_s: float | None = None, overrides: bool = False
) -> Marker[Any, ..., Any]:
    """Mark a Worker method as callable on the whole Cluster with dispatch ``mode``.

    The function is returned unchanged (it still runs as a plain method inside the actor); only a
    :class:`MethodSpec` is attached. ``timeout_s`` overrides the role's call timeout for this method. For the type
    checker the result is a :class:`Registered` of the mode, which typed cluster handles read
    (:func:`roll.core.cluster.cluster.on_cluster`). ``overrides=True``: this method of a worker class replaces
    the method of the same name that one of its parts registers (see the module docstring); without a part's
    method to replace it is a ``TypeError`` when the class is defined.
    """
    if not isinstance(mode, Dispatch):
        raise TypeError(f"register(mode=...) takes a Dispatch member, got {mode!r}")
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"register(timeout_s=...) must be > 0 seconds, got {timeout_s!r}")
    if not isinstance(overrides, bool):
        raise TypeError(f"register(overrides=...) takes True or False, got {overrides!r}")
    spec = MethodSpec(mode, timeout_s, overrides)

    def mark(fn: Callable[..., Any]) -> Any:
        setattr(fn, SPEC_ATTR, spec)
        return fn

    return mark


def get_spec(fn: object) -> MethodSpec | None:
    """The :class:`MethodSpec` of a registered function, None for any other object."""
    spec = getattr(fn, SPEC_ATTR, None)
    return spec if isinstance(spec, MethodSpec) else None


@runtime_checkable
class Shardable(Protocol):
    """What DP_SPLIT needs from a batch-like container (``roll.core.batch.Batch`` satisfies it).

    ``pad_to_multiple(k)`` returns ``(padded, pad_count)``; ``chunk(n)`` gives ``n`` equal parts in order;
    ``unpad(n)`` drops the last ``n`` rows; ``type(x).concat(parts)`` joins parts in order.
    """

    def __len__(self) -> int: ...

    def chunk(self, n: int) -> Sequence[Any]: ...

    def pad_to_multiple(self, k: int) -> tuple[Any, int]: ...

    def unpad(self, n: int) -> Any: ...


@dataclass(frozen=True)
class CallPlan:
    """Which ranks to call with which arguments, and what ``collect`` needs to undo (``pad`` rows added)."""

    ranks: tuple[int, ...]
    args: tuple[Args, ...]
    pad: int = 0
    padded_len: int = 0
    collect_from: tuple[int, ...] | None = None
    """Positions in ``ranks`` whose results ``collect`` uses (None: all), for ``MP_SPLIT``."""


@dataclass(frozen=True)
class DispatchRule:
    """The pair of plain functions behind one :class:`Dispatch` mode."""

    split: Callable[[tuple[Any, ...], dict[str, Any], Mesh], CallPlan]
    collect: Callable[[list[Any], CallPlan], Any]


def _split_all(args: tuple[Any, ...], kwargs: dict[str, Any], mesh: Mesh) -> CallPlan:
    return CallPlan(tuple(range(mesh.world_size)), tuple((args, kwargs) for _ in range(mesh.world_size)))


def _collect_list(results: list[Any], plan: CallPlan) -> list[Any]:
    return results


def _split_rank_zero(args: tuple[Any, ...], kwargs: dict[str, Any], mesh: Mesh) -> CallPlan:
    return CallPlan((0,), ((args, kwargs),))


def _collect_first(results: list[Any], plan: CallPlan) -> Any:
    return results[0]


def _split_dp(args: tuple[Any, ...], kwargs: dict[str, Any], mesh: Mesh) -> CallPlan:
    shards, rest, pad, padded_len = _shards(args, mesh.world_size, "DP_SPLIT")
    per_rank = tuple(((shard, *rest), kwargs) for shard in shards)
    return CallPlan(tuple(range(mesh.world_size)), per_rank, pad, padded_len)


def _split_mp(args: tuple[Any, ...], kwargs: dict[str, Any], mesh: Mesh) -> CallPlan:
    shards, rest, pad, padded_len = _shards(args, mesh.dp, "MP_SPLIT")
    per_rank = tuple(((shards[mesh.dp_rank(r)], *rest), kwargs) for r in range(mesh.world_size))
    return CallPlan(tuple(range(mesh.world_size)), per_rank, pad, padded_len, mesh.collect_ranks())


def _shards(args: tuple[Any, ...], parts: int, mode: str) -> tuple[Sequence[Any], tuple[Any, ...], int, int]:
    """``args[0]`` padded to a multiple of ``parts`` and cut into ``parts`` equal shards; the other arguments."""
    if not args:
        raise TypeError(f"a {mode} method takes the data to split as its first positional argument")
    data, rest = args[0], args[1:]
    if isinstance(data, Shardable):
        padded, pad = data.pad_to_multiple(parts)
        shards: Sequence[Any] = padded.chunk(parts)
        padded_len = len(padded)
    elif isinstance(data, list):
        shards, pad = _chunk_list(data, parts)
        padded_len = len(data) + pad
    else:
        raise TypeError(
            f"a {mode} method needs a Batch (or another Shardable) or a list as its first argument, "
            f"got {type(data).__name__}"
        )
    if len(shards) != parts:
        raise TypeError(f"{type(data).__name__}.chunk({parts}) returned {len(shards)} parts")
    return shards, rest, pad, padded_len


def _chunk_list(data: list[Any], world_size: int) -> tuple[list[list[Any]], int]:
    """Equal chunks of ``data``, padded by repeating its last item (a valid row, unlike None)."""
    pad = -len(data) % world_size
    if pad and not data:
        pad = 0
    padded = data + [data[-1]] * pad if pad else data
    size = len(padded) // world_size
    return [padded[i * size : (i + 1) * size] for i in range(world_size)], pad


def _collect_dp(results: list[Any], plan: CallPlan) -> Any:
    if results and all(isinstance(r, Shardable) for r in results):
        joined: Any = type(results[0]).concat(results)
        if len(joined) != plan.padded_len and _PAD_COLUMN in getattr(joined, "tensors", {}):
            return _drop_marked_rows(joined)
        return _unpad(joined, plan, lambda n: joined.unpad(n))
    if results and all(isinstance(r, list) for r in results):
        flat = [item for r in results for item in r]
        return _unpad(flat, plan, lambda n: flat[: len(flat) - n])
    return results


def _collect_mp(results: list[Any], plan: CallPlan) -> Any:
    picked = results if plan.collect_from is None else [results[i] for i in plan.collect_from]
    return _collect_dp(picked, plan)


def _drop_marked_rows(joined: Any) -> Any:
    """Rows not marked in the pad column, without the column: for methods that return several rows per input
    row (``generate`` with ``n`` samples per prompt) and copy each input row's pad mark onto its outputs."""
    keep_B = ~joined.tensors[_PAD_COLUMN].bool()
    kept = joined.select(keep_B.nonzero().reshape(-1))
    del kept.tensors[_PAD_COLUMN]
    return kept


def _unpad(joined: Any, plan: CallPlan, drop_last: Callable[[int], Any]) -> Any:
    if plan.pad == 0:
        return joined
    if len(joined) != plan.padded_len:
        raise WorkerError(
            f"DP_SPLIT could not remove {plan.pad} padding rows: the ranks returned {len(joined)} rows in total "
            f"for {plan.padded_len} rows in; return one row per input row, or return something that is not a "
            "Batch or list to get the per-rank results"
        )
    return drop_last(plan.pad)


def registered_methods(worker_cls: type) -> dict[str, MethodSpec]:
    """Every method of ``worker_cls`` (inherited ones included) and of its declared parts (see the module
    docstring) that carries a :func:`register` marker."""
    return {name: entry.spec for name, entry in _registry(worker_cls).items()}


def registered_functions(worker_cls: type) -> dict[str, Callable[..., Any]]:
    """The function behind each registered method of ``worker_cls``, unbound: a method of the class itself (its
    ``self`` is the worker) or of a part's class (its ``self`` is the part). For structural checks such as
    signature comparisons; a Cluster needs only :func:`registered_methods`."""
    return {name: entry.fn for name, entry in _registry(worker_cls).items()}


def part_methods(worker_cls: type) -> dict[str, str]:
    """The registered methods of ``worker_cls`` that its parts hold: method name -> the attribute holding the part.
    A method the class overrides is the class's own, not listed here (see :func:`overridden_methods`)."""
    return {name: entry.part for name, entry in _registry(worker_cls).items() if entry.part is not None}


def overridden_methods(worker_cls: type) -> dict[str, str]:
    """The registered methods of ``worker_cls`` that replace a part's (``@register(..., overrides=True)``, see the
    module docstring): method name -> the attribute holding the part whose method the class's replaces."""
    return {
        name: entry.replaces for name, entry in _registry(worker_cls).items() if entry.replaces is not None
    }


def declared_parts(worker_cls: type) -> dict[str, type]:
    """``worker_cls``'s :data:`PARTS_ATTR` mapping (attribute name -> class of the part held there), checked."""
    parts = getattr(worker_cls, PARTS_ATTR, None) or {}
    if not isinstance(parts, Mapping) or not all(
        isinstance(k, str) and k.isidentifier() and isinstance(v, type) for k, v in parts.items()
    ):
        raise TypeError(
            f"{worker_cls.__name__}.{PARTS_ATTR} must map attribute names to the classes of the parts held there, "
            f"e.g. {{'sender': WeightSender}}; got {parts!r}"
        )
    return dict(parts)


@dataclass(frozen=True)
class _Entry:
    """One registered name of a worker class: the attribute of the part holding it (None: the class's own), the
    function, its spec, and for an override the attribute of the part whose method it replaces."""

    part: str | None
    fn: Callable[..., Any]
    spec: MethodSpec
    replaces: str | None = None


@functools.cache
def _registry(worker_cls: type) -> dict[str, _Entry]:
    """Registered name -> its :class:`_Entry`. Raises ``TypeError`` for a name registered twice (by two parts, or
    by a part and the class without ``overrides=True``), for a marker that overrides nothing, for an unregistered
    class attribute that a part's method would hide, and for nested parts."""
    found = {name: _Entry(None, fn, spec) for name, fn, spec in _marked(worker_cls)}
    for part, part_cls in declared_parts(worker_cls).items():
        if declared_parts(part_cls):
            raise TypeError(
                f"{worker_cls.__name__}.{PARTS_ATTR}[{part!r}]: {part_cls.__name__} declares parts of its own; "
                f"parts do not nest: declare every part on {worker_cls.__name__}"
            )
        if part in found:
            raise TypeError(
                f"{worker_cls.__name__}: part attribute {part!r} has the name of a registered method; rename the part"
            )
        for name, fn, spec in _marked(part_cls):
            if spec.overrides:
                raise TypeError(
                    f"{part_cls.__name__}.{name} is marked overrides=True, but {part_cls.__name__} is a part "
                    f"(held by {worker_cls.__name__} as {part!r}) and parts do not override: drop the marker"
                )
            held = found.get(name)
            if held is None:
                if hasattr(worker_cls, name):
                    raise TypeError(
                        f"{worker_cls.__name__}.{name} is not registered, but part {part!r} ({part_cls.__name__}) "
                        f"registers {name!r}: the cluster would call the part's and never it; rename it, or mark "
                        "it @register(mode, overrides=True) to replace the part's method"
                    )
                found[name] = _Entry(part, fn, spec)
            elif held.part is None and held.spec.overrides and held.replaces is None:
                found[name] = _Entry(None, held.fn, held.spec, replaces=part)
            else:
                raise TypeError(f"{worker_cls.__name__}: {_clash(worker_cls, name, held, part)}")
    idle = sorted(n for n, e in found.items() if e.part is None and e.spec.overrides and e.replaces is None)
    if idle:
        raise TypeError(
            f"{worker_cls.__name__}: {', '.join(idle)} marked overrides=True but no part registers "
            f"{'that name' if len(idle) == 1 else 'those names'} (parts: {sorted(declared_parts(worker_cls))}); "
            "drop the marker, or hold the part whose method it replaces"
        )
    return found


def _marked(cls: type) -> list[tuple[str, Callable[..., Any], MethodSpec]]:
    """``(name, function, spec)`` of every attribute of ``cls`` (inherited ones included) with a marker."""
    out = []
    for name in dir(cls):
        fn = getattr(cls, name, None)
        spec = get_spec(fn)
        if spec is not None and callable(fn):
            out.append((name, fn, spec))
    return out


def _clash(worker_cls: type, name: str, first: _Entry, second: str) -> str:
    parts = declared_parts(worker_cls)
    if first.part is None:
        if first.replaces is not None:
            return (
                f"method {name!r} overrides part {first.replaces!r} ({parts[first.replaces].__name__})'s and is "
                f"registered by part {second!r} ({parts[second].__name__}) too; a cluster method needs one owner: "
                "rename one of the parts' methods, or hold only one of those parts"
            )
        return (
            f"method {name!r} is registered by the class itself and by part {second!r} ({parts[second].__name__}); "
            "a cluster method needs one owner: rename one of them, or mark the class's "
            "@register(mode, overrides=True) to replace the part's method"
        )
    return (
        f"method {name!r} is registered by part {first.part!r} ({parts[first.part].__name__}) and by part "
        f"{second!r} ({parts[second].__name__}); a cluster method needs one owner: rename one of them, or hold "
        "only one of those parts"
    )


RULES: dict[Dispatch, DispatchRule] = {
    Dispatch.ONE_TO_ALL: DispatchRule(_split_all, _collect_list),
    Dispatch.DP_SPLIT: DispatchRule(_split_dp, _collect_dp),
    Dispatch.RANK_ZERO: DispatchRule(_split_rank_zero, _collect_first),
    Dispatch.MP_SPLIT: DispatchRule(_split_mp, _collect_mp),
}
