"""What a worker role builds: one frozen, typed spec per kind of role, the only argument of its constructor.

A driver says *what* each cluster's actors build, and with which strategy config; the actor builds it::

    Cluster("actor_train", role_ref("ActorTrainWorker"), role_cfg,
            init_args=(TrainerSpec(model=cfg.model, strategy=fsdp2_cfg, total_steps=100),))

- :class:`TrainerSpec`: a trained model (``ActorTrainWorker``, ``CriticWorker``, ``RewardModelWorker`` and the
  modes' trainers: SFT, the distillation student).
- :class:`GeneratorSpec`: an inference replica that samples and scores (``ActorInferWorker``).
- :class:`HybridSpec`: a trainer and its generator in one process (``HybridActorWorker``).
- :class:`ScorerSpec`: a frozen model used forward-only (``ReferenceWorker``, ``TeacherWorker``); either kind
  of strategy.

The strategy config's ``type`` names the ``roll.strategy`` plugin that builds it (``fsdp2``, ``megatron``, ``hf``,
``vllm`` or another distribution's), so no spec carries a plugin name beside its config. Light module: pydantic
configs and dataclasses only, so a driver builds specs without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from roll.workers.config import HFInferConfig
from roll.workers.roles.config import ModelConfig

__all__ = ["GeneratorSpec", "HybridSpec", "ScorerSpec", "StrategyChoice", "TrainerSpec"]


class StrategyChoice(Protocol):
    """A strategy config: any config model whose ``type`` names its ``roll.strategy`` plugin (the built-in
    :class:`~roll.workers.config.FSDP2Config`, ``MegatronConfig``, ``HFInferConfig``, ``VLLMConfig``, or a
    plugin's own)."""

    @property
    def type(self) -> str: ...


@dataclass(frozen=True, kw_only=True)
class TrainerSpec:
    """A role that trains ``model`` with the train strategy ``strategy``; ``total_steps`` sizes the LR schedule,
    ``threads`` sets torch's intra-op threads in the actor (CPU runs where phases alternate)."""

    model: ModelConfig
    strategy: StrategyChoice
    total_steps: int = 1
    threads: int | None = None


@dataclass(frozen=True, kw_only=True)
class GeneratorSpec:
    """An inference replica of ``model`` behind the infer strategy ``strategy`` (hf by default)."""

    model: ModelConfig
    strategy: StrategyChoice = field(default_factory=HFInferConfig)


@dataclass(frozen=True, kw_only=True)
class HybridSpec:
    """``trainer`` and a generator with the infer strategy ``infer`` in one process (``placement: hybrid``): the
    generator serves the trainer's model, and the weight sync stays in process."""

    trainer: TrainerSpec
    infer: StrategyChoice = field(default_factory=HFInferConfig)


@dataclass(frozen=True, kw_only=True)
class ScorerSpec:
    """A frozen ``model`` scored forward-only, behind an infer strategy (hf by default) or a train strategy
    (fsdp2, to shard a large reference or teacher); it never trains."""

    model: ModelConfig
    strategy: StrategyChoice = field(default_factory=HFInferConfig)
