"""Helpers shared by the roles: building strategies through the plugin seam, Batch <-> micro-batch, pad rows."""

from __future__ import annotations

from typing import Any

import torch

from roll.core import columns as C
from roll.core import plugins
from roll.core.batch import PAD_COLUMN, Batch
from roll.core.cluster import Worker
from roll.core.errors import ConfigError, DataError, PluginError
from roll.core.types import StrategySpec
from roll.workers.metrics import LossMetrics
from roll.workers.roles.model import Head, check_vocab, load_model, load_tokenizer
from roll.workers.roles.spec import TrainerSpec
from roll.workers.types import (
    ForwardOutput,
    InferStrategy,
    LossDefaults,
    LossFn,
    MicroBatch,
    ScoringStrategy,
    TrainStrategy,
)
from roll.workers.vision import has_media


def strategy_spec(name: str, kind: str, role: str) -> StrategySpec:
    """The ``roll.strategy`` plugin ``name``, checked to be of ``kind`` (train/infer)."""
    spec: StrategySpec = plugins.load("roll.strategy", name)  # checked to be a StrategySpec by the loader
    if spec.kind != kind:
        raise ConfigError(
            f"{role}: strategy {name!r} is a {spec.kind} strategy; this role needs a {kind} one"
        )
    return spec


def build_train(spec: StrategySpec, config: Any, model: Any, role: str, **kwargs: Any) -> TrainStrategy:
    """``spec.build(config, model, **kwargs)``, checked to implement :class:`TrainStrategy`."""
    strategy = spec.build(config, model, **kwargs)
    if not isinstance(strategy, TrainStrategy):
        raise _incomplete(strategy, TrainStrategy, spec.name, role)
    return strategy


def build_infer(spec: StrategySpec, config: Any, model: Any, role: str, **kwargs: Any) -> InferStrategy:
    """``spec.build(config, model, **kwargs)``, checked to implement :class:`InferStrategy`."""
    strategy = spec.build(config, model, **kwargs)
    if not isinstance(strategy, InferStrategy):
        raise _incomplete(strategy, InferStrategy, spec.name, role)
    return strategy


def _incomplete(strategy: object, protocol: type, name: str, role: str) -> PluginError:
    members = sorted(n for n in vars(protocol) if not n.startswith("_"))
    missing = [m for m in members if not hasattr(strategy, m)]
    return PluginError(
        f"{role}: strategy {name!r} built a {type(strategy).__name__}, which lacks the {protocol.__name__} "
        f"members {missing}"
    )


def use_threads(threads: int | None) -> None:
    """Set torch's intra-op threads in this actor (a spec's ``threads``; None leaves torch's default)."""
    if threads:
        torch.set_num_threads(threads)


def build_trainer(
    worker: Worker, spec: TrainerSpec, *, head: Head = "causal_lm", **kwargs: Any
) -> tuple[TrainStrategy, Any]:
    """A training role's setup: join the role's process group, load ``spec.model`` (with ``head``) and its
    tokenizer, check they agree, and build the train strategy ``spec.strategy.type`` over ``spec.total_steps``
    (``kwargs``: the plugin's extras, such as ``forward``). Returns the strategy and the tokenizer."""
    join_default_group(worker)
    plugin = strategy_spec(spec.strategy.type, "train", worker.role)
    model = load_model(spec.model, worker.role, head=head)
    tokenizer = load_tokenizer(spec.model, worker.role)
    check_vocab(tokenizer, model, spec.model, worker.role)
    strategy = build_train(plugin, spec.strategy, model, worker.role, total_steps=spec.total_steps, **kwargs)
    return strategy, tokenizer


def token_budget(spec: TrainerSpec) -> int | None:
    """The strategy's ``max_tokens_per_micro_batch`` (None where it has none: megatron, a plugin's)."""
    budget: int | None = getattr(spec.strategy, "max_tokens_per_micro_batch", None)
    return budget


def join_default_group(worker: Worker) -> None:
    """Join the role's own torch.distributed group when there is more than one rank (FSDP needs it)."""
    if worker.world_size > 1:
        worker.init_process_group()


def micro_batch(batch: Batch) -> dict[str, torch.Tensor]:
    """The batch's tensor columns under their :mod:`roll.core.columns` names (the DP pad column left out): the
    :data:`~roll.workers.types.MicroBatch` a strategy and its loss read; it must hold ``input_ids_BT`` and
    ``attention_mask_BT``."""
    require(batch, C.INPUT_IDS, C.ATTENTION_MASK)
    return {k: v for k, v in batch.tensors.items() if k != PAD_COLUMN}


def vision_columns(batch: Batch) -> dict[str, list[Any]]:
    """The batch's per-row image and video columns (``{}`` without either): strategies take them as ``vision=``,
    and only then, so text batches reach strategies without image support unchanged."""
    columns: dict[str, list[Any]] = {
        k: list(batch.non_tensors[k]) for k in C.VISION_COLUMNS if k in batch.non_tensors
    }
    if not has_media(columns):
        return {}
    for raw in (C.IMAGES, C.VIDEOS):  # the raw media, for engines that process them themselves (vLLM)
        if raw in batch.non_tensors:
            columns[raw] = list(batch.non_tensors[raw])
    return columns


def vision_kwargs(batch: Batch) -> dict[str, Any]:
    """``{"vision": columns}`` for a batch with images, else ``{}`` (to spread into a strategy call)."""
    columns = vision_columns(batch)
    return {"vision": columns} if columns else {}


def require(batch: Batch, *names: str) -> None:
    missing = [n for n in names if n not in batch]
    if missing:
        raise DataError(f"batch lacks columns {missing}; it has {batch.keys()}")


def real_rows(batch: Batch) -> Batch:
    """The rows DP_SPLIT did not add as padding (all rows when there is no pad column)."""
    if PAD_COLUMN not in batch.tensors:
        return batch
    keep_B = ~batch.tensors[PAD_COLUMN].bool()
    return batch.select(keep_B.nonzero().reshape(-1))


class ZeroWeight(LossDefaults):
    """A :class:`LossFn` that contributes nothing: lets a rank with only padding rows join the collectives. It asks
    for the inner loss's entropy (the same forward) and declares nothing else: its micro-batch is a padding row."""

    def __init__(self, inner: LossFn) -> None:
        self.needs_entropy = inner.needs_entropy
        self._inner = inner

    def __call__(self, output: ForwardOutput, micro_batch: MicroBatch) -> tuple[torch.Tensor, LossMetrics]:
        loss_sum, _ = self._inner(output, micro_batch)
        return loss_sum * 0.0, {}

    def count_units(self, micro_batch: MicroBatch) -> float:
        return 0.0


def train_on(
    strategy: TrainStrategy, batch: Batch, loss_fn: LossFn, temperature: float = 1.0, *, prefix: str
) -> dict[str, float]:
    """One optimizer step on this rank's real rows; DP padding rows are not trained on.

    Returns ``loss``, ``grad_norm``, ``lr``, ``tokens``, ``units`` and the loss's own metrics under ``prefix``
    (``actor/``, ``critic/`` ...: the role states it), unit-weighted over this rank's micro-batches. A rank that
    received only padding runs its forwards with a zero-weighted loss, because FSDP's collectives need every rank
    to take part; the global unit count comes from the other ranks, and it reports no loss metrics.
    """
    real = real_rows(batch)
    if len(real) == 0:
        real, loss_fn = batch.slice(0, 1), ZeroWeight(loss_fn)
    inputs: dict[str, Any] = {**micro_batch(real), **vision_columns(real)}
    step = strategy.train_step(inputs, loss_fn, temperature=temperature)
    tokens = float(real.tensors[C.ATTENTION_MASK].sum()) if not isinstance(loss_fn, ZeroWeight) else 0.0
    out = {
        "loss": step.loss,
        "grad_norm": step.grad_norm,
        "lr": step.lr,
        "tokens": tokens,
        "units": step.num_units,
    }
    return {**out, **{f"{prefix}{k}": v for k, v in step.metrics.items()}}


def logprobs_of(strategy: ScoringStrategy, batch: Batch, temperature: float, with_entropy: bool) -> Batch:
    """``logp_BT`` (and ``entropy_BT``) of ``batch``'s sequences under ``strategy``, forward only, on the CPU."""
    mb = micro_batch(batch)
    scores = strategy.compute_logprobs(
        mb[C.INPUT_IDS], mb[C.ATTENTION_MASK], temperature=temperature, with_entropy=with_entropy,
        **vision_kwargs(batch),
    )  # fmt: skip
    return scores_batch(batch, **{C.LOGP: scores.logp_BT, C.ENTROPY: scores.entropy_BT})


def check_micro_batch_fits(batch: Batch, limit: int | None, role: str, key: str) -> None:
    """Reject a single sequence longer than a per-micro-batch token budget, naming the role and key."""
    if limit is None or C.ATTENTION_MASK not in batch.tensors:
        return
    lengths_B = batch.tensors[C.ATTENTION_MASK].sum(-1)
    if len(lengths_B) and int(lengths_B.max()) > limit:
        longest = int(lengths_B.max())
        raise ConfigError(
            f"{role}: a sample has {longest} tokens but {role}.{key} = {limit}; one sequence cannot be split "
            f"across micro-batches. Raise {role}.{key} to at least {longest} or truncate the data"
        )


def scores_batch(batch: Batch, **columns: torch.Tensor | None) -> Batch:
    """A batch of ``columns`` (None dropped) on the CPU, keeping the input's ``meta``."""
    tensors = {k: v.detach().float().cpu() for k, v in columns.items() if v is not None}
    return Batch(tensors, meta=batch.meta)
