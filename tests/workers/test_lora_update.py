"""LoRA model updates send the adapter alone, and the inference workers then serve exactly the trainer's merged
model: same weights (checksum), same greedy tokens, same log-probs; a second sync replaces the adapter instead of
merging it twice."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _roles_helpers import MODEL, ClusterSet, Spec, TokenSumNLL, fsdp2, hf_infer, sequences

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster
from roll.core.testing import tiny_role
from roll.workers.config import LoraConfig, SamplingParams
from roll.workers.model_update import ModelUpdateGroup, pack_bucket, weights_checksum
from roll.workers.roles import ActorTrainWorker
from roll.workers.roles.spec import TrainerSpec

LORA = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


@pytest.fixture(scope="module")
def roles(shared_roles: ClusterSet) -> Iterator[tuple[Cluster, Cluster]]:
    shared_roles.start()
    spec = Spec(
        "actor_train",
        ActorTrainWorker,
        tiny_role(),
        {"spec": TrainerSpec(model=MODEL, strategy=fsdp2(lora=LORA))},
    )
    own = ClusterSet({"lora": spec}).start()
    try:
        yield own.get()["lora"], shared_roles.get()["infer"]
    finally:
        own.shutdown()


@pytest.fixture(scope="module")
def base() -> Any:
    from transformers import AutoModelForCausalLM

    from roll.data.models import resolve_model_path

    return AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-1m"))


def adapter_bytes(config: Any) -> int:
    """fp32 ``A [r, in]`` and ``B [out, r]`` of q_proj (out = heads * head_dim) and v_proj (out = kv heads *
    head_dim) in every layer."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q_out, v_out = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    per_layer = LORA.r * (config.hidden_size + q_out) + LORA.r * (config.hidden_size + v_out)
    return 4 * config.num_hidden_layers * per_layer


def merged_model_greedy(base: Any, state: dict[str, torch.Tensor]) -> list[list[int]]:
    """Greedy tokens of a local copy of ``base`` holding ``state`` (the trainer's merged weights)."""
    import copy

    from roll.workers.hf_infer import HFInferStrategy

    model = copy.deepcopy(base)
    model.load_state_dict(state)
    return [s.token_ids for s in HFInferStrategy(model, hf_infer()).generate(PROMPTS, GREEDY)]


def test_lora_sync_sends_adapters_only_and_serves_the_merged_model(
    roles: tuple[Cluster, Cluster], base: Any
) -> None:
    train, infer = roles
    infer.update_weights([ray.put(pack_bucket(base.state_dict()))], 0)  # serve the untouched base model
    full_bytes = sum(t.numel() * t.element_size() for t in base.state_dict().values())
    seqs = sequences(rows=3, seed=5)
    groups = [
        ModelUpdateGroup(train, infer, bucket_mb=0.01, mode="object_store"),
        ModelUpdateGroup(train, infer, bucket_mb=0.01, mode="collective", start_version=10),
    ]
    for step, group in enumerate(groups):
        train.train_step(sequences(rows=4, seed=step), TokenSumNLL())
        for _ in range(2):  # the second sync of the same adapter must not merge it twice
            report = group.sync()
            # One bucket, despite bucket_mb=0.01: an adapter travels whole. Its bytes are A and B alone.
            assert (report.buckets, report.bytes) == (1, adapter_bytes(base.config))
            assert report.bytes < full_bytes / 20
            group.verify()  # every infer rank: the trainer's merged weights, bit for bit, at this version
        merged = train.full_state_dict()[0]
        assert weights_checksum(merged) != weights_checksum(base.state_dict())  # the adapter did change W
        out = infer.generate(Batch(non_tensors={C.PROMPT_IDS: PROMPTS}), GREEDY)
        assert out[C.POLICY_VERSION].tolist() == [group.version] * 3
        assert list(out[C.RESPONSE_IDS]) == merged_model_greedy(base, merged)
        served = infer.compute_logprobs(seqs)[C.LOGP]
        trained = train.compute_logprobs(seqs)[C.LOGP]  # peft's unmerged forward: x W + x A B s
        mask = seqs[C.RESPONSE_MASK].bool()  # the infer side zeroes log-probs outside it
        torch.testing.assert_close(served[mask], trained[mask], atol=1e-5, rtol=0)
