"""Megatron for the critic (value head) and the reward model (score head), and what every megatron role shares.

CPU part (plain tensors, no Megatron): the head roles dispatch their row methods by model-parallel group; the
HF <-> Megatron layout of a value and a score head (replicated on every TP rank, under HF names after gathering,
in buckets); the readers that turn a stage's output into values and scores agree with the fsdp2 forwards'
semantics; outputs are joined and trimmed field by field; the checkpoint's file names and the error on resuming
with another TP/PP layout.

GPU part (``gpu``; Megatron-Core): a TP=1 critic gives the values of the HF model it was built from, a step lowers
its loss, and its HF export loads as ``AutoModelForTokenClassification``; with two GPUs TP=2 gives TP=1's values,
loss, grad norm and updated weights.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core import columns as C
from roll.core.errors import CheckpointError
from roll.workers.fsdp2 import _concat_outputs
from roll.workers.megatron_config import MegatronConfig
from roll.workers.megatron_convert import GPTLayout, hf_to_megatron, megatron_to_hf
from roll.workers.megatron_heads import (
    LM_HEAD,
    VALUE_HEAD,
    StageOutput,
    align_left,
    head_of,
    read_scores,
    read_values,
)
from roll.workers.megatron_train import check_optimizer_shard, concat_outputs, trim_output
from roll.workers.model_update import pack_bucket, plan_update, unpack_bucket
from roll.workers.roles.heads import SCORE_FORWARD, VALUE_FORWARD
from roll.workers.types import ForwardOutput, LossDefaults

HAS_MEGATRON = importlib.util.find_spec("megatron") is not None


def test_head_roles_dispatch_rows_by_model_parallel_group() -> None:
    from roll.core.cluster import (
        Dispatch,  # imports Ray: inside, so the gpu tests collect where Ray is absent
    )
    from roll.core.cluster.dispatch import get_spec
    from roll.workers.roles.critic import CriticWorker
    from roll.workers.roles.reward_model import RewardModelWorker

    methods = [CriticWorker.compute_values, CriticWorker.train_step]
    methods += [RewardModelWorker.score, RewardModelWorker.train_step]
    assert [get_spec(m).mode for m in methods] == [Dispatch.MP_SPLIT] * 4  # type: ignore[union-attr]
    assert get_spec(CriticWorker.export_hf).mode is Dispatch.ONE_TO_ALL  # type: ignore[union-attr]


def test_the_roles_forwards_carry_their_megatron_heads() -> None:
    """One ``forward=`` for both backends: fsdp2 calls the pair (its transformers forward), megatron reads its
    head; no forward is a causal LM."""
    assert head_of(VALUE_FORWARD) is VALUE_HEAD and head_of(SCORE_FORWARD).kind == "score"
    assert head_of(None) is LM_HEAD
    assert VALUE_FORWARD.hf.__name__ == "value_forward"


# ---- layout of the heads ------------------------------------------------------------------------------------


def _head_state(head: str) -> tuple[dict[str, torch.Tensor], Any]:
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, Qwen2Config

    config = Qwen2Config(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_labels=1, tie_word_embeddings=True,
    )  # fmt: skip
    cls = AutoModelForTokenClassification if head == "value" else AutoModelForSequenceClassification
    torch.manual_seed(0)
    return {k: v.clone() for k, v in cls.from_config(config).state_dict().items()}, config


@pytest.mark.parametrize("head", ["value", "score"])
def test_head_is_replicated_on_tp_ranks_and_gathers_to_hf_names_in_buckets(head: str) -> None:
    """A TP=2 value/score model: the head (``score.weight`` [1, 64], and ``score.bias`` [1] for a value head) is
    the same ``output_layer`` tensor on both ranks, the vocab-parallel embedding is split (100 rows padded to a
    multiple of 128 x 2 = 256 -> 128 each); gathered and sent in 0.05 MiB buckets, the tensors arrive bit for bit under exactly the HF model's
    names (no ``lm_head``: a head model never ties, even with ``tie_word_embeddings``)."""
    hf_state, config = _head_state(head)
    layout = GPTLayout.from_hf_config(config, tp_size=2, head=head)  # type: ignore[arg-type]
    assert not layout.tied_embeddings
    shards = hf_to_megatron(hf_state, layout, tp_size=2)
    head_names = {"output_layer.weight", "output_layer.bias"} if head == "value" else {"output_layer.weight"}
    assert {k for k in shards[0] if k.startswith("output_layer")} == head_names
    for name in head_names:
        assert torch.equal(shards[0][name], shards[1][name])
    assert shards[0]["output_layer.weight"].shape == (1, 64)
    assert shards[1]["embedding.word_embeddings.weight"].shape == (128, 64)
    gathered = megatron_to_hf(shards, layout)
    received: dict[str, torch.Tensor] = {}
    plan = plan_update(gathered, 0.05, None)
    assert len(plan) > 1
    for names in plan:
        bucket = pack_bucket({n: gathered[n] for n in names})
        received.update(unpack_bucket(bucket.flat_N, bucket.meta))
    assert set(received) == set(hf_state)
    for name, tensor in hf_state.items():
        assert torch.equal(received[name], tensor), name


def test_head_sits_on_the_last_pipeline_stage() -> None:
    """PP=2 value model: stage 0 holds the embedding and layer 0 (no head), stage 1 layer 1 (locally 0), the final
    norm and the head; the two stages' HF tensors together are the model's."""
    hf_state, config = _head_state("value")
    layout = GPTLayout.from_hf_config(config, head="value")
    first = hf_to_megatron(hf_state, layout, pp_size=2, pp_rank=0)[0]
    last = hf_to_megatron(hf_state, layout, pp_size=2, pp_rank=1)[0]
    assert "output_layer.weight" not in first and "embedding.word_embeddings.weight" not in last
    assert torch.equal(last["output_layer.bias"], hf_state["score.bias"])
    merged = {**megatron_to_hf([first], layout, pp_size=2, pp_rank=0)}
    merged.update(megatron_to_hf([last], layout, pp_size=2, pp_rank=1))
    assert set(merged) == set(hf_state)


# ---- readers --------------------------------------------------------------------------------------------------


def _left_padded() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row 0 left-padded by 2, row 1 full, row 2 right-padded by 1 (T = 5); per-token head outputs h = 10 b + t."""
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    ids = (torch.arange(15).reshape(3, 5) + 1) * mask
    h_BT = (10 * torch.arange(3)[:, None] + torch.arange(5)[None]).float()
    return ids, mask, h_BT


def _aligned_output(h_BT: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> StageOutput:
    """What the model outputs on the aligned rows: the value at original column ``start + t`` at column ``t``."""
    aligned = align_left(ids, mask)
    cols = (torch.arange(5)[None] + aligned.start_B[:, None]).clamp(max=4)
    return StageOutput(h_BT.gather(1, cols)[..., None], aligned, vocab_size=100)


def test_value_reader_gives_each_position_its_value_and_zero_on_padding() -> None:
    """``values_BT`` equals h * mask (what ``value_forward`` returns), in the original left/right padding."""
    ids, mask, h_BT = _left_padded()
    out = read_values(_aligned_output(h_BT, ids, mask), 1.0, False)
    assert out.values_BT is not None and out.logp_BT.shape == (3, 0)
    torch.testing.assert_close(out.values_BT, h_BT * mask)


def test_score_reader_reads_each_rows_last_valid_token() -> None:
    """Last valid tokens: row 0 column 4 (h = 4), row 1 column 4 (14), row 2 column 3 (23)."""
    ids, mask, h_BT = _left_padded()
    out = read_scores(_aligned_output(h_BT, ids, mask), 1.0, False)
    assert out.scores_B is not None
    torch.testing.assert_close(out.scores_B, torch.tensor([4.0, 14.0, 23.0]))


# ---- outputs, checkpoints ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _WithLogits(ForwardOutput):
    logits_BTV: torch.Tensor | None = None


def test_outputs_join_and_trim_field_by_field_keeping_their_type() -> None:
    """Two micro-batches of 2 rows padded to [3, 6] (pipeline padding) trim back to [2, 4] and join to 4 rows;
    a subclass's extra field (a student's logits) survives in the megatron and the fsdp2 join alike."""
    part = _WithLogits(logp_BT=torch.ones(3, 6), scores_B=torch.ones(3), logits_BTV=torch.ones(3, 6, 7))
    trimmed = trim_output(part, 2, 4)
    assert trimmed.logp_BT.shape == (2, 4) and trimmed.logits_BTV.shape == (2, 4, 7)  # type: ignore[union-attr]
    assert trimmed.scores_B is not None and trimmed.scores_B.shape == (2,)
    for joined in (concat_outputs([trimmed, trimmed]), _concat_outputs([trimmed, trimmed])):
        assert isinstance(joined, _WithLogits) and joined.logits_BTV is not None
        assert joined.logits_BTV.shape == (4, 4, 7) and joined.values_BT is None


def test_resuming_with_another_tp_layout_names_the_one_written(tmp_path: Path) -> None:
    """A folder written at TP=2 (shards tp0, tp1) resumed at TP=4 misses tp3: the error says TP 4 asked, TP 2 found."""
    for t in range(2):
        (tmp_path / f"optimizer.pt.tp{t}.pp0.pt").write_bytes(b"")
    check_optimizer_shard(tmp_path / "optimizer.pt.tp1.pp0.pt", MegatronConfig(tensor_parallel_size=2))
    with pytest.raises(
        CheckpointError, match=r"tensor_parallel_size=4.*written with tensor_parallel_size=2, pipe"
    ):
        check_optimizer_shard(tmp_path / "optimizer.pt.tp3.pp0.pt", MegatronConfig(tensor_parallel_size=4))


# ---- GPU --------------------------------------------------------------------------------------------------------


def critic_tp_run(tp: int, export_dir: str | None = None) -> dict[str, Any]:
    """One fp32 Megatron critic step at tensor parallel size ``tp`` on a fixed batch (run in each rank's process):
    values before, the step's loss and grad norm, and a digest of the weights after."""
    from transformers import AutoModelForTokenClassification, Qwen2Config

    from roll.workers.config import OptimizerConfig
    from roll.workers.gpu_specs import MEGATRON

    config = Qwen2Config(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, num_labels=1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_config(config)
    cfg = MegatronConfig(tensor_parallel_size=tp, precision="fp32", optimizer=OptimizerConfig(lr=1e-3))
    strategy = MEGATRON.build(cfg, model, total_steps=1, forward=VALUE_FORWARD)
    batch = _gpu_batch()
    hf_values = _hf_values(
        model, batch
    )  # before the step (export_hf loads the trained weights into ``model``)
    values = strategy.forward_only(batch[C.INPUT_IDS], batch[C.ATTENTION_MASK]).values_BT.cpu()
    result = strategy.train_step(batch, _ValueMSE())
    after = strategy.forward_only(batch[C.INPUT_IDS], batch[C.ATTENTION_MASK]).values_BT.cpu()
    if export_dir is not None:
        strategy.export_hf(export_dir)
    digest = {k: float(v.double().sum()) for k, v in strategy.state_dict().items()}
    return {
        "values": values.tolist(), "after": after.tolist(), "loss": result.loss, "grad_norm": result.grad_norm,
        "weights": digest, "hf_values": hf_values.tolist(),
    }  # fmt: skip


class _ValueMSE(LossDefaults):
    """Sum over valid tokens of (value - 1)^2; units are those tokens."""

    def __call__(self, output: ForwardOutput, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        assert output.values_BT is not None
        mask = mb[C.ATTENTION_MASK].to(output.values_BT.device)
        return (((output.values_BT - 1.0) ** 2) * mask).sum(), {}

    def count_units(self, mb: Any) -> float:
        return float(mb[C.ATTENTION_MASK].sum())


def _gpu_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 512, (4, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[2, 12:] = 0
    return {C.INPUT_IDS: ids * mask, C.ATTENTION_MASK: mask}


def _hf_values(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    from roll.workers.roles.heads import value_forward

    with torch.no_grad():
        return value_forward(
            model.float().eval(), batch[C.INPUT_IDS], batch[C.ATTENTION_MASK], False, 1.0
        ).values_BT


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_MEGATRON and torch.cuda.is_available()), reason="needs Megatron-Core and CUDA")
def test_megatron_critic_tp1_gives_the_hf_values_learns_and_exports(tmp_path: Path) -> None:
    from transformers import AutoModelForTokenClassification

    one = critic_tp_run(1, str(tmp_path / "hf"))
    torch.testing.assert_close(
        torch.tensor(one["values"]), torch.tensor(one["hf_values"]), atol=1e-3, rtol=1e-3
    )
    mask = _gpu_batch()[C.ATTENTION_MASK]
    before = float(((torch.tensor(one["values"]) - 1) ** 2 * mask).sum() / mask.sum())
    after = float(((torch.tensor(one["after"]) - 1) ** 2 * mask).sum() / mask.sum())
    assert one["loss"] == pytest.approx(before, rel=1e-4) and after < before
    exported = AutoModelForTokenClassification.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    torch.testing.assert_close(
        _hf_values(exported, _gpu_batch()), torch.tensor(one["after"]), atol=1e-3, rtol=1e-3
    )


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_MEGATRON, reason="Megatron-Core is not installed (roll-workers[megatron])")
def test_megatron_critic_tp2_matches_tp1(tmp_path: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("TP=2 needs two GPUs")
    _tp_launch().assert_tp2_matches_tp1(tmp_path, Path(__file__), "critic_tp_run", "values")


def _tp_launch() -> Any:
    """``tests/gpu/tp_launch.py`` (the tests folder is no package: found by path)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "gpu"))
    import tp_launch

    return tp_launch
