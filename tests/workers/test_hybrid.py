"""HybridActorWorker: train and generate in one actor; after a train step and an in-process sync its generation
equals that of a fresh hf inference strategy built from the trainer's weights."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _roles_helpers import MODEL, ClusterSet, Spec, TokenSumNLL, fsdp2, hf_infer, sequences

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster
from roll.core.testing import tiny_role
from roll.workers.config import SamplingParams
from roll.workers.model_update import weights_checksum
from roll.workers.roles import HybridActorWorker

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


@pytest.fixture(scope="module")
def hybrid(ray_local: object) -> Iterator[Cluster]:
    spec = Spec(
        "actor", HybridActorWorker, tiny_role(), {"model": MODEL, "strategy": fsdp2(), "infer": hf_infer()}
    )
    own = ClusterSet({"hybrid": spec})
    try:
        yield own.get()["hybrid"]
    finally:
        own.shutdown()


def test_generation_after_train_and_sync_equals_a_fresh_infer_strategy(hybrid: Cluster) -> None:
    from transformers import AutoModelForCausalLM

    from roll.data.tiny import resolve_model_path
    from roll.workers.hf_infer import HFInferStrategy

    prompts = Batch(non_tensors={C.PROMPT_IDS: PROMPTS})
    before = hybrid.generate(prompts, GREEDY)
    hybrid.train_step(sequences(rows=4, seed=1), TokenSumNLL())
    assert hybrid.weights_checksum("infer") != hybrid.weights_checksum("train")  # not synced yet
    assert hybrid.sync_weights(3) == [1]  # one bucket, handed over in process
    assert hybrid.policy_version() == [3]
    assert hybrid.weights_checksum("infer") == hybrid.weights_checksum("train")
    after = hybrid.generate(prompts, GREEDY)
    assert after[C.POLICY_VERSION].tolist() == [3] * 3

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-1m"))
    state = hybrid.full_state_dict()[0]
    model.load_state_dict(state)
    fresh = HFInferStrategy(model, hf_infer()).generate(PROMPTS, GREEDY)
    assert list(after[C.RESPONSE_IDS]) == [s.token_ids for s in fresh]
    assert weights_checksum(model.state_dict()) == hybrid.weights_checksum("infer")[0]
    assert list(after[C.RESPONSE_IDS]) != list(before[C.RESPONSE_IDS])  # the step changed what it generates
    seqs = sequences(rows=3, seed=5)
    logp = hybrid.compute_logprobs(seqs)[C.LOGP]
    mask = seqs[C.ATTENTION_MASK].bool()
    local = (
        HFInferStrategy(model, hf_infer()).compute_logprobs(seqs[C.INPUT_IDS], seqs[C.ATTENTION_MASK]).logp_BT
    )
    torch.testing.assert_close(logp[mask], local[mask], atol=1e-5, rtol=0)
