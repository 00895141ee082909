"""ModelUpdateGroup: trainer weights to two inference workers by object store and by a standalone gloo group;
checksums, versions, and greedy tokens equal to those of the trainer's exported HF folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _roles_helpers import ClusterSet, TokenSumNLL, hf_infer, sequences

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster
from roll.workers.config import SamplingParams
from roll.workers.model_update import (
    Mode,
    ModelUpdateGroup,
    pack_bucket,
    plan_buckets,
    unpack_bucket,
    weights_checksum,
)

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


def test_buckets_round_trip_mixed_dtypes() -> None:
    named = {"a": torch.randn(300, 300), "b": torch.arange(10), "c": torch.randn(7).bfloat16()}
    plans = plan_buckets(named, bucket_mb=0.2)
    assert plans == [["a"], ["b", "c"]]  # a alone is 0.34 MiB > 0.2: its own bucket
    for names in plans:
        bucket = pack_bucket({n: named[n] for n in names})
        for name, tensor in unpack_bucket(bucket.flat_N, bucket.meta).items():
            assert torch.equal(tensor, named[name])
    assert weights_checksum(named) == weights_checksum({k: v.clone() for k, v in named.items()})


@pytest.fixture(scope="module")
def roles(shared_roles: ClusterSet) -> tuple[Cluster, Cluster]:
    """The shared one-rank trainer and two inference ranks (each test asserts relative to what it syncs)."""
    shared = shared_roles.get()
    return shared["train1"], shared["infer"]


@pytest.mark.parametrize("mode", ["object_store", "collective"])
def test_sync_gives_trainer_weights_and_version(roles: tuple[Cluster, Cluster], mode: Mode) -> None:
    train, infer = roles
    before = infer.weights_checksum()
    train.train_step(sequences(rows=4, seed=1), TokenSumNLL())
    group = ModelUpdateGroup(
        train, infer, bucket_mb=0.25, mode=mode, start_version=10 if mode == "collective" else 0
    )
    report = group.sync()
    assert report.buckets > 1 and report.mode == mode
    group.verify()  # checksum of every infer rank == trainer's, and the version served
    assert infer.policy_version() == [group.version] * 2
    assert infer.weights_checksum() != before
    out = infer.generate(Batch(non_tensors={C.PROMPT_IDS: PROMPTS}), GREEDY)
    assert out[C.POLICY_VERSION].tolist() == [group.version] * 3


def test_greedy_tokens_equal_those_of_the_exported_trainer(
    roles: tuple[Cluster, Cluster], tmp_path: Path
) -> None:
    """trainer export_hf -> AutoModelForCausalLM.from_pretrained -> greedy decode locally == infer workers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll.workers.hf_infer import HFInferStrategy

    train, infer = roles
    train.train_step(sequences(rows=4, seed=2), TokenSumNLL())
    ModelUpdateGroup(train, infer, bucket_mb=1.0, mode="collective").sync()
    train.export_hf(str(tmp_path / "hf"))
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    local = HFInferStrategy(model, hf_infer(), tokenizer=tokenizer).generate(PROMPTS, GREEDY)
    remote = infer.generate(
        Batch(non_tensors={C.PROMPT_IDS: PROMPTS}), GREEDY
    )  # 3 prompts over 2 ranks: padded
    assert list(remote[C.RESPONSE_IDS]) == [s.token_ids for s in local]
    assert weights_checksum(model.state_dict()) == train.weights_checksum()[0]


def test_generate_n_samples_over_padded_ranks(roles: tuple[Cluster, Cluster]) -> None:
    """3 prompts x n=2 over 2 ranks: the padding prompt's samples are dropped by their is_pad_B mark."""
    _, infer = roles
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=3)
    out = infer.generate(Batch(non_tensors={C.PROMPT_IDS: PROMPTS}), params)
    assert out[C.PROMPT_INDEX].tolist() == [0, 0, 1, 1, 2, 2]
    assert "is_pad_B" not in out
