"""The seam through which a mode extends RLVR by composition: an :class:`AdvantageTransform`.

RLVR's step is ``generate -> score -> advantages -> train -> sync``. A transform adds roles of its own (teachers,
say), starts their clusters with the policy's, rewrites the batch after RLVR's advantages (on-policy distillation
mixes the teachers' log-ratio in), and adds metrics. The pipeline is RLVR's own; the mode that brings the transform
is a different plugin name with its own config, never a subclass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from roll.core.batch import Batch
from roll.core.cluster import Cluster
from roll.core.config.sections import RoleConfig

if TYPE_CHECKING:
    from roll.pipelines.rlvr.pipeline import RLVRPipeline


@runtime_checkable
class AdvantageTransform(Protocol):
    """What RLVR calls on a transform, in this order: :meth:`roles` (placement), :meth:`prepare` (in ``setup``,
    before the policy's clusters start; returns clusters to set up with them), :meth:`after_warmup`, then per
    step :meth:`advantages` and :meth:`metrics`."""

    def roles(self) -> Mapping[str, RoleConfig]: ...

    def prepare(self, pipeline: RLVRPipeline) -> list[Cluster]: ...

    def after_warmup(self, pipeline: RLVRPipeline) -> None: ...

    def advantages(self, batch: Batch) -> Batch: ...

    def metrics(self) -> dict[str, float]: ...
