"""``hf_capped``: roll's ``hf`` inference strategy with two extra options that hold whatever a pipeline asks:
``max_new_tokens`` caps every request's response length, ``stop`` adds stop strings to every request. For example, a
serving budget on a shared machine, or a format whose answer ends at a known marker.

A thin wrapper: the config model is ``hf``'s plus the two options, and the strategy holds an ``HFInferStrategy``
built from it and passes every call through, changing only ``generate``'s sampling params. No decode loop, weight
loading or offloading is copied. The spec's module imports no torch: ``build`` imports the hf strategy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from roll.core.types import StrategySpec
from roll.workers.config import HFInferConfig

if TYPE_CHECKING:
    from roll_example_strategy.strategy import CappedStrategy


class HFCappedConfig(HFInferConfig):
    """``strategy: {type: hf_capped, ...}``: every option of ``hf`` plus ``max_new_tokens`` and ``stop``."""

    type: Literal["hf_capped"] = "hf_capped"  # type: ignore[assignment]  # the plugin's own discriminator value
    max_new_tokens: int | None = Field(None, ge=1, description="cap on every request's max_new_tokens")
    stop: list[str] = Field(default_factory=list, description="stop strings added to every request")


def build(config: HFCappedConfig, model: Any, **kwargs: Any) -> CappedStrategy:
    """roll.core.types.StrategyBuild: runs in each inference worker; ``kwargs`` are ``tokenizer``, ``eos_token_ids``."""
    from roll_example_strategy.strategy import CappedStrategy

    return CappedStrategy(config, model, **kwargs)


SPEC = StrategySpec(
    name="hf_capped",
    kind="infer",
    config_model=HFCappedConfig,
    build=build,
    description="hf with a cap on response length and extra stop strings",
)
