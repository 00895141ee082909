"""Every strategy class implements the whole protocol of its kind, member by member, with compatible signatures.

Structural and on the classes (building vLLM or Megatron strategies needs their GPU stacks): a protocol method
must exist on the class and accept every call the protocol allows (the same parameters, of the same kinds, with
defaults where the protocol has them; extra parameters only with defaults); a protocol property must be a
property or an annotated attribute of the class. The modules import here, where neither vLLM nor Megatron is
installed: they import their backends lazily.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _signatures import incompatibility

from roll.core.errors import ConfigError, PluginError
from roll.core.types import StrategySpec
from roll.workers.config import FSDP2Config
from roll.workers.fsdp2 import FSDP2TrainStrategy
from roll.workers.hf_infer import HFInferStrategy
from roll.workers.megatron_train import MegatronTrainStrategy
from roll.workers.roles._common import build_train
from roll.workers.types import InferStrategy, ScoringStrategy, TrainStrategy
from roll.workers.vllm_infer import VLLMInferStrategy

CASES = [
    (FSDP2TrainStrategy, TrainStrategy),
    (MegatronTrainStrategy, TrainStrategy),
    (HFInferStrategy, InferStrategy),
    (VLLMInferStrategy, InferStrategy),
    *[
        (cls, ScoringStrategy)
        for cls in (FSDP2TrainStrategy, MegatronTrainStrategy, HFInferStrategy, VLLMInferStrategy)
    ],
]


def members(protocol: type) -> list[str]:
    return sorted(n for n in vars(protocol) if not n.startswith("_"))


def annotated(cls: type, name: str) -> bool:
    return any(name in getattr(k, "__annotations__", {}) for k in cls.__mro__)


@pytest.mark.parametrize(("cls", "protocol"), CASES, ids=lambda x: x.__name__)
def test_strategy_class_implements_its_protocol(cls: type, protocol: type) -> None:
    problems = []
    for name in members(protocol):
        proto_attr = vars(protocol)[name]
        impl_attr = inspect.getattr_static(cls, name, None)
        if isinstance(proto_attr, property):
            if not (isinstance(impl_attr, property) or annotated(cls, name)):
                problems.append(f"{name}: not a property or annotated attribute")
        elif impl_attr is None or not callable(impl_attr):
            problems.append(f"{name}: missing")
        elif (why := incompatibility(proto_attr, impl_attr)) is not None:
            problems.append(f"{name}: {why}")
    assert problems == [], f"{cls.__name__} vs {protocol.__name__}: {problems}"


def test_the_checker_rejects_an_incompatible_signature() -> None:
    """The check above can fail: a keyword-only temperature without default, a missing parameter."""

    class Proto:
        def f(self, x: int, *, temperature: float = 1.0) -> None: ...

    def no_default(self: object, x: int, *, temperature: float) -> None: ...

    def missing(self: object, x: int) -> None: ...

    def fine(self: object, x: int, temperature: float = 1.0, extra: int = 0) -> None: ...

    assert incompatibility(Proto.f, no_default) == "parameter 'temperature' has no default"
    assert incompatibility(Proto.f, missing) == "lacks parameter 'temperature'"
    assert incompatibility(Proto.f, fine) is None


def test_megatron_rejects_a_bare_transformers_forward_before_needing_its_stack() -> None:
    """A forward with no Megatron reader (a bare transformers function) fails with the fix, not with a TypeError
    (or a missing Megatron install) from deep inside the build; the roles' heads are ``ForwardPair``s."""
    with pytest.raises(ConfigError, match=r"cannot run the transformers forward.*ForwardPair.*fsdp2"):
        MegatronTrainStrategy(object(), forward=lambda *args: None)


def test_a_plugin_that_builds_an_incomplete_strategy_is_named() -> None:
    class Half:
        def train_step(self) -> None: ...

    spec = StrategySpec(name="half", kind="train", config_model=FSDP2Config, build=lambda cfg, model: Half())
    with pytest.raises(PluginError, match=r"actor: strategy 'half' built a Half.*lacks.*'set_lr'"):
        build_train(spec, FSDP2Config(), None, "actor")
