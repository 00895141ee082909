"""Worker roles as real Ray actors: data-parallel equivalence, generate vs trainer log-probs, critic, reward model,
checkpoint round trip. Clusters are module-scoped (an actor that imports torch costs ~15 s here)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _roles_helpers import MODEL, ClusterSet, Spec, TokenSumNLL, fsdp2, sequences

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster
from roll.core.testing import tiny_role
from roll.data.sequences import to_sequences
from roll.workers.config import SamplingParams
from roll.workers.model_update import ModelUpdateGroup
from roll.workers.roles import CriticWorker, RewardModelWorker
from roll.workers.roles.spec import TrainerSpec
from roll.workers.types import ForwardOutput, LossDefaults


@pytest.fixture(scope="module")
def clusters(shared_roles: ClusterSet) -> Iterator[dict[str, Cluster]]:
    """The shared ``train1``, ``train2``, ``infer`` (conftest.py) plus this module's critic and reward model."""
    shared_roles.start()
    head_kw = {"spec": TrainerSpec(model=MODEL, strategy=fsdp2(), total_steps=3)}
    own = ClusterSet(
        {
            "critic": Spec("critic", CriticWorker, tiny_role(), head_kw),
            "reward": Spec("reward", RewardModelWorker, tiny_role(), head_kw),
        }
    ).start()
    try:
        yield {**shared_roles.get(), **own.get()}
    finally:
        own.shutdown()


def test_generate_logprobs_equal_trainer_logprobs(clusters: dict[str, Cluster]) -> None:
    """Sampled (T=0.8, n=2) log-probs from ActorInferWorker == ActorTrainWorker.compute_logprobs at T=0.8
    (same weights: the trainer's are synced to the inference workers first)."""
    version = (
        ModelUpdateGroup(clusters["train1"], clusters["infer"], mode="object_store").sync().policy_version
    )
    prompts = Batch(non_tensors={C.PROMPT_IDS: [[5, 6, 7], [8, 9], [10, 11, 12, 13]]})
    params = SamplingParams(n=2, temperature=0.8, max_new_tokens=6, seed=1, ignore_eos=True)
    samples = clusters["infer"].generate(prompts, params)
    assert len(samples) == 6
    assert samples[C.PROMPT_INDEX].tolist() == [0, 0, 1, 1, 2, 2]
    assert samples[C.SAMPLE_INDEX].tolist() == [0, 1] * 3
    assert samples[C.POLICY_VERSION].tolist() == [version] * 6
    seqs = to_sequences(samples, pad_token_id=0)
    logp = clusters["train1"].compute_logprobs(seqs, temperature=0.8)
    torch.testing.assert_close(logp[C.LOGP] * seqs[C.RESPONSE_MASK], seqs[C.INFER_LOGP], atol=1e-5, rtol=0)
    again = clusters["infer"].compute_logprobs(seqs, temperature=0.8)
    torch.testing.assert_close(again[C.LOGP], seqs[C.INFER_LOGP], atol=1e-5, rtol=0)


def test_two_ranks_reach_the_parameters_of_one_after_three_steps(
    clusters: dict[str, Cluster], tmp_path: Path
) -> None:
    """8 rows split 4/4 over 2 FSDP2 ranks vs all 8 on one rank: the loss is normalised by the global token count,
    so the gradients, and after 3 AdamW steps the parameters, agree (1e-5; eps=1e-3, see _roles_helpers.OPTIM).
    Both start from one state: train1's checkpoint (weights, optimizer, scheduler), loaded into train2."""
    clusters["train1"].save_checkpoint(str(tmp_path / "start"))
    clusters["train2"].load_checkpoint(str(tmp_path / "start"))
    assert clusters["train2"].weights_checksum()[0] == clusters["train1"].weights_checksum()[0]
    for step in range(3):
        batch = sequences(rows=8, seed=step)
        m2 = clusters["train2"].train_step(batch, TokenSumNLL())
        m1 = clusters["train1"].train_step(batch, TokenSumNLL())
        assert len(m2) == 2 and len(m1) == 1
        assert m2[0]["loss"] == pytest.approx(m1[0]["loss"], abs=1e-5)
        assert m2[0]["tokens"] + m2[1]["tokens"] == m1[0]["tokens"]
        # the loss's own metric comes back under the role's prefix; one rank: its unit mean is the loss
        assert m1[0]["actor/nll"] == pytest.approx(m1[0]["loss"], abs=1e-5)
    p2 = clusters["train2"].full_state_dict()[0]
    p1 = clusters["train1"].full_state_dict()[0]
    assert p1.keys() == p2.keys()
    for name in p1:
        torch.testing.assert_close(p2[name], p1[name], atol=1e-5, rtol=0, msg=name)


def test_dp_padding_rows_are_not_trained_on(clusters: dict[str, Cluster]) -> None:
    """3 rows over 2 ranks: DP_SPLIT pads to 4; the pad row is dropped, so tokens count only real rows."""
    batch = sequences(rows=3, seed=7)
    metrics = clusters["train2"].train_step(batch, TokenSumNLL())
    assert sum(m["tokens"] for m in metrics) == float(batch[C.ATTENTION_MASK].sum())
    logp = clusters["train2"].compute_logprobs(batch, with_entropy=True)
    assert logp[C.LOGP].shape == logp[C.ENTROPY].shape == (3, 12)


def test_checkpoint_round_trip_restores_weights(clusters: dict[str, Cluster], tmp_path: Path) -> None:
    train = clusters["train1"]
    train.save_checkpoint(str(tmp_path / "ckpt"))
    saved = train.weights_checksum()[0]
    train.train_step(sequences(rows=4, seed=9), TokenSumNLL())
    assert train.weights_checksum()[0] != saved
    train.load_checkpoint(str(tmp_path / "ckpt"))
    assert train.weights_checksum()[0] == saved


def test_critic_values_and_training(clusters: dict[str, Cluster]) -> None:
    batch = sequences(rows=3, seed=3)
    values = clusters["critic"].compute_values(batch)[C.VALUES]
    assert values.shape == (3, 12) and values.dtype == torch.float32
    assert bool((values[batch[C.ATTENTION_MASK] == 0] == 0).all())
    metrics = clusters["critic"].train_step(batch, ValueToZero())
    assert metrics[0]["loss"] > 0 and metrics[0]["grad_norm"] > 0
    after = clusters["critic"].compute_values(batch)[C.VALUES]
    assert not torch.equal(after, values)


def test_reward_model_scores_read_the_last_valid_token(clusters: dict[str, Cluster]) -> None:
    """Right- and left-padded copies of the same sequences score the same (pad-token independent pooling)."""
    batch = sequences(rows=4, seed=4)
    right = clusters["reward"].score(batch)[C.SCORES]
    assert right.shape == (4,)
    lengths = batch[C.ATTENTION_MASK].sum(-1)
    ids = torch.zeros_like(batch[C.INPUT_IDS])
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths.tolist()):
        ids[b, 12 - n :] = batch[C.INPUT_IDS][b, :n]
        mask[b, 12 - n :] = 1
    left = clusters["reward"].score(Batch({C.INPUT_IDS: ids, C.ATTENTION_MASK: mask}))[C.SCORES]
    torch.testing.assert_close(left, right, atol=1e-4, rtol=0)
    metrics = clusters["reward"].train_step(batch, ScoreUp())
    assert metrics[0]["grad_norm"] > 0


class ValueToZero(LossDefaults):
    """Critic loss: summed squared values over valid tokens."""

    def __call__(
        self, output: ForwardOutput, micro_batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        assert output.values_BT is not None
        return (output.values_BT**2 * micro_batch[C.ATTENTION_MASK]).sum(), {}

    def count_units(self, micro_batch: dict[str, torch.Tensor]) -> float:
        return float(micro_batch[C.ATTENTION_MASK].sum())


class ScoreUp(LossDefaults):
    """RM loss: push every score up (one unit per sequence)."""

    def __call__(
        self, output: ForwardOutput, micro_batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        assert output.scores_B is not None
        return -output.scores_B.sum(), {}

    def count_units(self, micro_batch: dict[str, torch.Tensor]) -> float:
        return float(micro_batch[C.INPUT_IDS].shape[0])


import ray  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
