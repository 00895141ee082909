"""Config models of worker roles: the model a role loads and the one model-role section every pipeline uses.

A model role is ``{num_workers, cpus_per_worker, gpus_per_worker, device_group, model, strategy}``: placement
(:class:`~roll.core.config.sections.RoleConfig`), the model, and ``strategy``, a ``type``-discriminated union of
the strategy configs of roll-workers. Which strategy types a role accepts is declared here once
(:data:`STRATEGY_KINDS`): a trained role (:class:`TrainRoleConfig`) takes ``fsdp2`` or ``megatron``, a generating or
scoring role (:class:`InferRoleConfig`) takes ``hf`` or ``vllm``; a strategy of the other kind is a config error
naming the role's kind and the types it accepts. A ``strategy`` without ``type`` is the kind's default
(``fsdp2`` to train, ``hf`` to generate). A ``type`` outside roll-workers names a ``roll.strategy`` plugin of
another distribution: its section validates against that plugin's config model (a light import of its spec), and
the role builds it through the plugin seam like the built-in ones (docs/plugins.md#strategies).

Micro-batch sizes are not a strategy's business: they come from the run's ``batch`` section and reach the strategy
at build time (:func:`with_micro_batches`). Light module: pydantic only, no torch, so ``roll validate`` stays fast.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, SerializeAsAny, ValidatorFunctionWrapHandler, field_validator, model_validator

from roll.core import plugins
from roll.core.config.base import RollModel
from roll.core.config.sections import RoleConfig
from roll.core.errors import PluginError
from roll.workers.config import FSDP2Config, HFInferConfig
from roll.workers.megatron_config import MegatronConfig
from roll.workers.vllm_config import VLLMConfig

LoadDType = Literal["auto", "float32", "bfloat16", "float16"]
StrategyKind = Literal["train", "infer"]

DEFAULT_MODEL = "tiny-1m"

STRATEGY_KINDS: dict[str, StrategyKind] = {
    "fsdp2": "train",
    "megatron": "train",
    "hf": "infer",
    "vllm": "infer",
}
"""Strategy ``type`` -> kind; the ``roll.strategy`` entry points of the same names must agree (a test checks)."""

TrainStrategyConfig = SerializeAsAny[Annotated[FSDP2Config | MegatronConfig, Field(discriminator="type")]]
InferStrategyConfig = SerializeAsAny[Annotated[HFInferConfig | VLLMConfig, Field(discriminator="type")]]
"""The built-in strategy configs of each kind; a plugin's config (see :func:`_plugin_strategy`) also fits the field,
and ``SerializeAsAny`` dumps it with its own fields."""

MICRO_BATCH_FIELDS = ("micro_batch_size", "max_tokens_per_micro_batch")
"""Strategy fields that :func:`with_micro_batches` fills from ``batch``; a config must leave them unset."""


class ModelConfig(RollModel):
    """Which model a role loads and how.

    ``path`` is a tiny preset (``tiny-1m``, ``tiny-10m``, ``tiny-50m``), a local ``save_pretrained`` folder or a
    hub id, resolved by :func:`roll.data.models.resolve_model_path`. ``tokenizer`` defaults to ``path``.
    ``dtype`` is the dtype the weights are loaded in: ``auto`` loads float32, because training keeps fp32 master
    weights (FSDP2 casts to bf16 on CUDA itself) and the inference strategy casts to its own ``dtype``.
    ``seed`` seeds torch before loading, so randomly initialised heads (critic, reward model) are reproducible.
    """

    path: str = Field(
        min_length=1,
        description="tiny preset (tiny-1m, tiny-10m, tiny-50m, tiny-think-1m), local folder or hub id",
    )
    tokenizer: str | None = Field(None, description="tokenizer folder or hub id; unset: path")
    dtype: LoadDType = Field(
        "auto", description="dtype the weights load in; auto: float32 (fp32 master weights)"
    )
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = Field(
        None, description="transformers' attention kernel; unset: transformers' default"
    )
    seed: int = Field(0, description="seeds torch before loading, so randomly initialised heads reproduce")
    trust_remote_code: bool = Field(
        False, description="allow a hub model's own Python code (transformers' flag)"
    )


DEFAULT_STRATEGY: dict[StrategyKind, str] = {"train": "fsdp2", "infer": "hf"}
"""The ``type`` a strategy section without one gets."""


def _check_kind(value: Any, kind: StrategyKind) -> Any:
    """Give a strategy section without ``type`` the kind's default, and reject a ``type`` of the other kind
    before pydantic's generic 'tag does not match' error."""
    if isinstance(value, dict) and "type" not in value:
        return {"type": DEFAULT_STRATEGY[kind], **value}
    if isinstance(value, dict) and isinstance(value.get("type"), str):
        other = STRATEGY_KINDS.get(value["type"])
        if other is not None and other != kind:
            accepted = ", ".join(t for t, k in STRATEGY_KINDS.items() if k == kind)
            role = "trains" if kind == "train" else "generates or scores (forward only)"
            raise ValueError(
                f"strategy type {value['type']!r} is an {other} strategy, but this role {role} and needs a "
                f"{kind} strategy: one of {accepted}"
            )
    return value


def _plugin_strategy(value: Any, kind: StrategyKind, handler: ValidatorFunctionWrapHandler) -> Any:
    """A strategy section validated: a built-in ``type`` by the union (``handler``), any other by the config model
    of the ``roll.strategy`` plugin of that name, which must be of ``kind``. Errors keep their key paths."""
    value = _check_kind(value, kind)
    name = value.get("type") if isinstance(value, dict) else None
    if not isinstance(name, str) or name in STRATEGY_KINDS:
        return handler(value)
    try:
        spec = plugins.load("roll.strategy", name)
    except PluginError as exc:
        raise ValueError(str(exc)) from None
    if spec.kind != kind:
        raise ValueError(
            f"strategy type {name!r} is an {spec.kind} strategy plugin; this role needs a {kind} one"
        )
    return spec.config_model.model_validate(value)


class TrainRoleConfig(RoleConfig):
    """A trained model on ``num_workers`` data-parallel workers: placement, model and a train strategy."""

    model: ModelConfig = Field(
        default_factory=lambda: ModelConfig(path=DEFAULT_MODEL), description="the model this role trains"
    )
    strategy: TrainStrategyConfig = Field(
        default_factory=FSDP2Config, description="train strategy (fsdp2 or megatron), chosen by its type"
    )

    @field_validator("strategy", mode="wrap")
    @classmethod
    def _train_kind(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _plugin_strategy(value, "train", handler)

    def data_parallel_size(self) -> int:
        """How many data-parallel replicas the workers form: ``num_workers / (tp * pp)`` under megatron, else
        ``num_workers``. Batch arithmetic divides by this, not by ``num_workers``."""
        if isinstance(self.strategy, MegatronConfig):
            tp, pp, _ = self.strategy.parallel_sizes()
            return max(1, self.num_workers // (tp * pp))
        return self.num_workers

    @model_validator(mode="after")
    def _workers_fill_model_parallel_groups(self) -> TrainRoleConfig:
        problem = model_parallel_problem(self.num_workers, self.strategy)
        if problem:
            raise ValueError(problem)
        return self


def model_parallel_problem(num_workers: int, strategy: object) -> str | None:
    """Why ``num_workers`` cannot hold ``strategy``'s tensor x pipeline parallel groups (None: it can)."""
    if not isinstance(strategy, MegatronConfig):
        return None
    tp, pp, _ = strategy.parallel_sizes()
    if num_workers % (tp * pp) == 0:
        return None
    return (
        f"num_workers = {num_workers} is not a multiple of strategy.tensor_parallel_size * "
        f"strategy.pipeline_parallel_size = {tp} * {pp}; the data-parallel size is num_workers / "
        f"(tp * pp). Use num_workers = {tp * pp * max(1, num_workers // (tp * pp))} or smaller parallel sizes"
    )


class InferRoleConfig(RoleConfig):
    """A generating or forward-only scoring model: placement, model (``None``: the run's policy) and an infer
    strategy."""

    model: ModelConfig | None = Field(None, description="default: the trained policy's model (actor_train)")
    strategy: InferStrategyConfig = Field(
        default_factory=HFInferConfig, description="infer strategy (hf or vllm), chosen by its type"
    )

    @field_validator("strategy", mode="wrap")
    @classmethod
    def _infer_kind(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _plugin_strategy(value, "infer", handler)


S = TypeVar("S", bound=RollModel)


class CriticRoleConfig(TrainRoleConfig):
    """A value model (PPO's critic): a backbone with a one-output value head whose head starts random.
    ``model`` and ``strategy`` default to the trained policy's (``actor_train``, before any warm-up)."""

    model: ModelConfig | None = Field(  # type: ignore[assignment]
        None, description="the value model's backbone; unset: actor_train's model"
    )
    strategy: TrainStrategyConfig | None = Field(  # type: ignore[assignment]
        None, description="train strategy; unset: actor_train's"
    )

    def resolved(self, actor: TrainRoleConfig) -> TrainRoleConfig:
        """The critic as it runs: ``actor``'s model and strategy where its own are unset (not re-validated: check
        :func:`model_parallel_problem` of the result, which the pipelines' config checks do)."""
        return TrainRoleConfig.model_construct(
            **{**dict(self), "model": self.model or actor.model, "strategy": self.strategy or actor.strategy}
        )


def with_micro_batches(strategy: S, micro_batch_samples: int | None, micro_batch_tokens: int | None) -> S:
    """``strategy`` with the micro-batch fields it has taken from the run's ``batch`` section."""
    update = {"micro_batch_size": micro_batch_samples, "max_tokens_per_micro_batch": micro_batch_tokens}
    fields = type(strategy).model_fields
    return strategy.model_copy(update={k: v for k, v in update.items() if k in fields and v is not None})


__all__ = [
    "DEFAULT_MODEL",
    "MICRO_BATCH_FIELDS",
    "STRATEGY_KINDS",
    "CriticRoleConfig",
    "InferRoleConfig",
    "InferStrategyConfig",
    "LoadDType",
    "ModelConfig",
    "StrategyKind",
    "TrainRoleConfig",
    "TrainStrategyConfig",
    "model_parallel_problem",
    "with_micro_batches",
]
