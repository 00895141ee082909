"""HybridActorWorker: train and generate in one actor, usable as a pipeline's train *and* infer cluster.

After a train step and an in-process sync its generation equals that of a fresh hf inference strategy built from
the trainer's weights, and its seeded samples and their log-probs equal those of a separate 2-rank
``ActorInferWorker`` cluster loaded with the same weights (so the seeds do not depend on how rows were split).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _roles_helpers import MODEL, ClusterSet, Spec, TokenSumNLL, fsdp2, hf_infer, sequences
from _signatures import incompatibility

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster, Dispatch
from roll.core.cluster.dispatch import registered_functions, registered_methods
from roll.core.errors import WorkerError
from roll.core.testing import tiny_role
from roll.workers.config import SamplingParams
from roll.workers.model_update import ModelUpdateGroup, pack_bucket, weights_checksum
from roll.workers.roles import ActorInferWorker, ActorTrainWorker, HybridActorWorker
from roll.workers.roles.spec import HybridSpec, TrainerSpec

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]

TRANSPORT = {
    "stage_weights",
    "weight_bucket",
    "release_weights",
    "update_endpoint",
    "join_update_group",
    "broadcast_weights",
    "update_weights",
    "receive_weights",
    "update_weights_ipc",
    "share_weight_bucket",
    "join_transfer_group",
    "receive_topk",
}
"""Cross-process model-update and logits-transfer plumbing (a hybrid syncs in process) and the metric variant
of train_step that issue 12 removes; every other registered method of the two roles is the pipelines' API."""


@pytest.fixture(scope="module")
def clusters(shared_roles: ClusterSet) -> Iterator[dict[str, Cluster]]:
    """This module's 1-rank hybrid plus the shared 2-rank ``infer`` cluster (conftest.py)."""
    shared_roles.start()
    spec = Spec(
        "actor",
        HybridActorWorker,
        tiny_role(),
        {"spec": HybridSpec(trainer=TrainerSpec(model=MODEL, strategy=fsdp2()), infer=hf_infer())},
    )
    own = ClusterSet({"hybrid": spec}).start()
    try:
        yield {**shared_roles.get(), **own.get()}
    finally:
        own.shutdown()


def _data_split(mode: Dispatch) -> Dispatch:
    """MP_SPLIT over ranks that are all their own DP rank (a hybrid is fsdp2, never model-parallel) is DP_SPLIT."""
    return Dispatch.DP_SPLIT if mode is Dispatch.MP_SPLIT else mode


@pytest.mark.parametrize("role_cls", [ActorTrainWorker, ActorInferWorker], ids=lambda c: c.__name__)
def test_hybrid_has_the_methods_pipelines_call_on_either_cluster(role_cls: type) -> None:
    """Each role's registered methods, its own and its parts' (ActorTrainWorker's are all its PolicyTrainer's and
    WeightSender's), against the hybrid's, compared function to function."""
    mine, my_functions = registered_methods(HybridActorWorker), registered_functions(HybridActorWorker)
    theirs = registered_functions(role_cls)
    problems = []
    for name, spec in registered_methods(role_cls).items():
        if name in TRANSPORT:
            continue
        if name not in mine or _data_split(mine[name].mode) != _data_split(spec.mode):
            problems.append(f"{name}: missing or dispatched differently")
        elif (why := incompatibility(theirs[name], my_functions[name])) is not None:
            problems.append(f"{name}: {why}")
    assert problems == []
    expected = {"train_step", "setup", "export_hf"} if role_cls is ActorTrainWorker else {"generate", "setup"}
    assert expected <= set(theirs)  # a part's methods are compared too, not only the class's own


def test_generation_after_train_and_sync_equals_a_fresh_infer_strategy(clusters: dict[str, Cluster]) -> None:
    from transformers import AutoModelForCausalLM

    from roll.data.models import resolve_model_path
    from roll.workers.hf_infer import HFInferStrategy

    hybrid = clusters["hybrid"]
    prompts = Batch(non_tensors={C.PROMPT_IDS: PROMPTS})
    before = hybrid.generate(prompts, GREEDY)
    hybrid.train_step(sequences(rows=4, seed=1), TokenSumNLL())
    assert hybrid.served_checksum() != hybrid.weights_checksum()  # not synced yet
    assert hybrid.sync_weights(3) == [1]  # one bucket, handed over in process
    assert hybrid.policy_version() == [3]
    assert hybrid.served_checksum() == hybrid.weights_checksum()
    after = hybrid.generate(prompts, GREEDY)
    assert after[C.POLICY_VERSION].tolist() == [3] * 3

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-1m"))
    state = hybrid.full_state_dict()[0]
    model.load_state_dict(state)
    fresh = HFInferStrategy(model, hf_infer()).generate(PROMPTS, GREEDY)
    assert list(after[C.RESPONSE_IDS]) == [s.token_ids for s in fresh]
    assert weights_checksum(model.state_dict()) == hybrid.served_checksum()[0]
    assert list(after[C.RESPONSE_IDS]) != list(before[C.RESPONSE_IDS])  # the step changed what it generates
    seqs = sequences(rows=3, seed=5)
    logp = hybrid.compute_logprobs(seqs)[C.LOGP]
    mask = seqs[C.ATTENTION_MASK].bool()
    local = (
        HFInferStrategy(model, hf_infer()).compute_logprobs(seqs[C.INPUT_IDS], seqs[C.ATTENTION_MASK]).logp_BT
    )
    torch.testing.assert_close(logp[mask], local[mask], atol=1e-5, rtol=0)


def test_one_hybrid_cluster_serves_as_train_and_infer_cluster(clusters: dict[str, Cluster]) -> None:
    """``ModelUpdateGroup(hybrid, hybrid)`` syncs in process and verifies; then 4 prompts x 2 samples at
    temperature 1 with ``seed=11`` give the same tokens and log-probs on the hybrid (1 rank, all 4 prompts) as on
    the shared 2-rank infer cluster (2 prompts each) loaded with the hybrid's weights."""
    hybrid, infer = clusters["hybrid"], clusters["infer"]
    updater = ModelUpdateGroup(hybrid, hybrid)
    assert updater.mode == "in_process"
    hybrid.train_step(sequences(rows=4, seed=2), TokenSumNLL())
    report = updater.sync()
    updater.verify()
    assert (report.buckets, hybrid.policy_version()) == (1, [report.policy_version])
    infer.update_weights([ray.put(pack_bucket(hybrid.full_state_dict()[0]))], report.policy_version)

    prompts = Batch(non_tensors={C.PROMPT_IDS: [*PROMPTS, [14, 15]]})
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, ignore_eos=True, seed=11)
    mine, theirs = hybrid.generate(prompts, params), infer.generate(prompts, params)
    assert mine[C.PROMPT_INDEX].tolist() == theirs[C.PROMPT_INDEX].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert list(mine[C.RESPONSE_IDS]) == list(theirs[C.RESPONSE_IDS])
    assert len({tuple(r) for r in mine[C.RESPONSE_IDS]}) > 4  # sampled, not one repeated answer
    assert mine[C.POLICY_VERSION].tolist() == theirs[C.POLICY_VERSION].tolist() == [report.policy_version] * 8
    for a, b in zip(mine[C.RESPONSE_LOGP], theirs[C.RESPONSE_LOGP]):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    with pytest.raises(WorkerError, match="in_process"):
        ModelUpdateGroup(hybrid, infer, mode="in_process")


def test_offload_and_reload_cover_both_sides_or_one_and_return_their_costs(
    clusters: dict[str, Cluster],
) -> None:
    """``offload``/``reload`` (the trainer's methods, overridden to cover both strategies) and
    ``offload_side``/``reload_side`` return ``seconds`` and ``freed_bytes`` per rank like every role's (0 bytes
    without CUDA: the state already lives in host memory) and leave both sides' weights as they were."""
    hybrid = clusters["hybrid"]
    served, trained = hybrid.served_checksum(), hybrid.weights_checksum()
    costs = [
        *hybrid.offload(),
        *hybrid.reload(),
        *hybrid.offload_side("train"),
        *hybrid.reload_side("train"),
        *hybrid.offload_side("infer"),
        *hybrid.reload_side("infer"),
    ]
    assert len(costs) == 6 and all(set(c) == {"seconds", "freed_bytes"} for c in costs)
    assert all(c["seconds"] >= 0 and c["freed_bytes"] == 0.0 for c in costs)
    assert (hybrid.served_checksum(), hybrid.weights_checksum()) == (served, trained)
    with pytest.raises(WorkerError, match="side must be 'train' or 'infer', got 'both'"):
        hybrid.offload_side("both")


def test_hybrid_sends_its_trainers_weights_to_another_process(clusters: dict[str, Cluster]) -> None:
    """A hybrid with a frozen reference (placement hybrid with KL): ``ModelUpdateGroup(hybrid, other)`` is an
    object-store update like a plain trainer's, and what arrives is the trainer's new weights, not the weights the
    hybrid's own generator still serves (it has not synced since the step)."""
    hybrid, infer = clusters["hybrid"], clusters["infer"]
    hybrid.train_step(sequences(rows=4, seed=3), TokenSumNLL())
    served_before = hybrid.served_checksum()[0]
    trained = hybrid.weights_checksum()[0]
    assert served_before != trained
    updater = ModelUpdateGroup(hybrid, infer)
    assert updater.mode == "object_store"
    report = updater.sync(7)
    updater.verify()
    assert report.buckets >= 1 and report.bytes > 0
    assert infer.weights_checksum() == [trained, trained] and infer.policy_version() == [7, 7]
    assert hybrid.served_checksum() == [served_before]
