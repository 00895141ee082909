"""The seam through which a mode extends RLVR by composition: an :class:`AdvantageTransform`.

RLVR's step is ``generate -> score -> advantages -> train -> sync``. A transform adds roles of its own (teachers,
say), starts their clusters with the policy's, rewrites the batch after RLVR's advantages (on-policy distillation
mixes the teachers' log-ratio in), and adds metrics. The pipeline is RLVR's own; the mode that brings the transform
is a different plugin name with its own config, never a subclass.

The transform never sees the pipeline: :meth:`AdvantageTransform.prepare` receives a :class:`TransformContext`,
the few things of the run it may use, built by the pipeline in ``setup``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from roll.core.batch import Batch
from roll.core.config.sections import RoleConfig
from roll.pipelines.common.host import PipelineHost
from roll.pipelines.policy.group import SetUp


@dataclass(frozen=True)
class TransformContext:
    """What RLVR lends a transform in :meth:`AdvantageTransform.prepare`: ``host`` (make and release clusters,
    log, the seed and output folder), the policy's ``tokenizer``, the run's prepared training prompt rows
    (``train_rows``, in data order) and its held-out prompts (``eval_prompts``, a prompt batch; ``None`` without
    eval data)."""

    host: PipelineHost
    tokenizer: Any
    train_rows: Sequence[Mapping[str, Any]]
    eval_prompts: Batch | None


@runtime_checkable
class AdvantageTransform(Protocol):
    """What RLVR calls on a transform, in this order: :meth:`roles` (placement), :meth:`prepare` (in ``setup``,
    before the policy's clusters start; returns clusters to set up with them), then per step :meth:`advantages`
    and :meth:`metrics`."""

    def roles(self) -> Mapping[str, RoleConfig]: ...

    def prepare(self, context: TransformContext) -> list[SetUp]: ...

    def advantages(self, batch: Batch) -> Batch: ...

    def metrics(self) -> dict[str, float]: ...
