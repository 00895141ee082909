"""Bad inputs to roles fail with errors naming the role and the config key; a dying worker names itself."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _roles_helpers import MODEL, TokenSumNLL, fsdp2, sequences

from roll.core.cluster import Cluster
from roll.core.errors import ConfigError, WorkerError
from roll.core.testing import tiny_role
from roll.workers.roles import ActorTrainWorker, ModelConfig, load_causal_lm, load_tokenizer
from roll.workers.roles.model import check_vocab
from roll.workers.roles.spec import TrainerSpec
from roll.workers.types import LossDefaults


def test_missing_local_path_names_role_and_key() -> None:
    with pytest.raises(ConfigError, match=r"actor_train\.model\.path: /no/such/model does not exist"):
        load_causal_lm(ModelConfig(path="/no/such/model"), "actor_train")


def test_unreachable_hub_id_says_offline_and_lists_presets(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    # No network here: offline mode makes the failure immediate instead of a DNS timeout.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        ConfigError, match=r"could not load model 'no-org/no-model' for actor_train: .*offline\? .*tiny-1m"
    ):
        load_tokenizer(ModelConfig(path="no-org/no-model"), "actor_train")


def test_tokenizer_larger_than_model_vocab(tmp_path: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    small = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=32))  # fmt: skip
    small.save_pretrained(tmp_path / "small")
    cfg = ModelConfig(path=str(tmp_path / "small"), tokenizer="tiny-1m")
    model = load_causal_lm(cfg, "reference")
    with pytest.raises(ConfigError, match=r"512 tokens .*vocab_size=64.*Set reference\.model\.tokenizer"):
        check_vocab(load_tokenizer(cfg, "reference"), model, cfg, "reference")


@pytest.fixture(scope="module")
def train(ray_local: object) -> Iterator[Cluster]:
    kwargs = {"spec": TrainerSpec(model=MODEL, strategy=fsdp2(max_tokens_per_micro_batch=8))}
    cluster = Cluster("actor_train", ActorTrainWorker, tiny_role(), init_kwargs=kwargs)
    try:
        cluster.setup()
        yield cluster
    finally:
        cluster.shutdown()


def test_sample_longer_than_micro_batch_budget(train: Cluster) -> None:
    with pytest.raises(WorkerError, match=r"actor_train: a sample has \d+ tokens but actor_train\.strategy\."
                       r"max_tokens_per_micro_batch = 8"):  # fmt: skip
        train.train_step(sequences(rows=2, T=12, seed=0), TokenSumNLL())


def test_worker_killed_mid_step_names_role_rank_method(train: Cluster) -> None:
    with pytest.raises(WorkerError, match=r"actor_train rank 0: train_step") as info:
        train.train_step(sequences(rows=2, T=8, seed=0), DieMidStep())
    assert info.value.role == "actor_train" and info.value.method == "train_step"  # type: ignore[attr-defined]


class DieMidStep(LossDefaults):
    """Kills the worker process inside the forward/backward, as an OOM kill would."""

    def __call__(self, output: object, micro_batch: object) -> tuple[object, dict[str, float]]:
        os._exit(1)

    def count_units(self, micro_batch: dict[str, Any]) -> float:
        return 1.0


import ray  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
