"""Megatron in the trainable roles: config, mesh, dispatch modes, and the model update's payload from TP shards.

CPU part: a megatron ``actor_train`` validates (and an impossible ``num_workers`` is rejected with the arithmetic),
its cluster mesh comes from the strategy config, the roles dispatch their row methods with ``MP_SPLIT``, and what
a TP=2 trainer sends to inference (its shards gathered to HF names by :mod:`roll.workers.megatron_convert`, then
bucketed) unpacks to exactly the HF state dict, under HF names.

GPU part (``gpu``; needs Megatron-Core and two GPUs): TP=2 gives TP=1's log-probs, loss and grad norm on one
batch, and the same weights after one step.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from roll.core import columns as C
from roll.workers.megatron_convert import GPTLayout, hf_to_megatron, megatron_to_hf
from roll.workers.model_update import pack_bucket, plan_update, unpack_bucket
from roll.workers.roles.config import TrainRoleConfig


def test_megatron_role_validates_and_gives_its_mesh() -> None:
    from roll.core.cluster import Mesh  # imports Ray: inside, so the gpu tests collect where Ray is absent

    role = TrainRoleConfig.model_validate(
        {"num_workers": 4, "strategy": {"type": "megatron", "tensor_parallel_size": 2}}
    )
    assert Mesh.for_role(role) == Mesh(4, tp=2)
    assert role.data_parallel_size() == 2  # batch arithmetic divides by 2 replicas, not 4 workers
    assert Mesh.for_role(role).collect_ranks() == (0, 2)
    assert Mesh.for_role(TrainRoleConfig(num_workers=3)) == Mesh(3)  # fsdp2: pure data parallel


def test_megatron_role_rejects_workers_that_do_not_fill_the_groups() -> None:
    """3 workers cannot hold TP groups of 2: the error spells out the product and a fix (2 workers)."""
    with pytest.raises(ValidationError, match=r"num_workers = 3 .* = 2 \* 1.*num_workers = 2"):
        TrainRoleConfig.model_validate(
            {"num_workers": 3, "strategy": {"type": "megatron", "tensor_parallel_size": 2}}
        )


def test_row_methods_of_trained_roles_dispatch_by_model_parallel_groups() -> None:
    """The trainer role's row methods; the SFT worker's (roll-pipelines) are checked in tests/pipelines/test_sft.py."""
    from roll.core.cluster.dispatch import Dispatch, registered_methods
    from roll.workers.roles.actor import ActorTrainWorker

    specs = registered_methods(ActorTrainWorker)  # its PolicyTrainer part's
    assert [specs[m].mode for m in ("train_step", "compute_logprobs")] == [Dispatch.MP_SPLIT] * 2


@pytest.fixture(scope="module")
def qwen2_state() -> tuple[dict[str, torch.Tensor], Any]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return {k: v.clone() for k, v in Qwen2ForCausalLM(config).state_dict().items()}, config


def test_update_payload_from_tp2_shards_is_the_hf_state_in_buckets(
    qwen2_state: tuple[dict[str, torch.Tensor], Any],
) -> None:
    """A TP=2 trainer's shards, gathered (``megatron_to_hf``), planned in 0.05 MiB buckets and packed, unpack to
    the HF tensors bit for bit under HF names. The largest tensors are the embedding and lm_head, 100 x 64 fp32 =
    25600 B each, so 52428 B buckets hold at most two of those: more than one bucket, none over the limit unless
    it holds one tensor alone."""
    hf_state, config = qwen2_state
    layout = GPTLayout.from_hf_config(config, tp_size=2)
    gathered = megatron_to_hf(hf_to_megatron(hf_state, layout, tp_size=2), layout)
    plan = plan_update(gathered, 0.05, None)
    limit = int(0.05 * 2**20)
    assert len(plan) > 1
    received: dict[str, torch.Tensor] = {}
    for names in plan:
        bucket = pack_bucket({n: gathered[n] for n in names})
        assert bucket.meta.nbytes <= limit or len(names) == 1
        received.update(unpack_bucket(bucket.flat_N, bucket.meta))
    assert set(received) == set(hf_state)
    for name, tensor in hf_state.items():
        assert torch.equal(received[name], tensor), name


# ---- GPU: TP=2 against TP=1 ----------------------------------------------------------------------------------

HAS_MEGATRON = importlib.util.find_spec("megatron") is not None


def tp_run(tp: int) -> dict[str, Any]:
    """One fp32 Megatron step at tensor parallel size ``tp`` on a fixed batch (run in each rank's process)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from roll.workers.config import OptimizerConfig
    from roll.workers.megatron_config import MegatronConfig
    from roll.workers.megatron_train import MegatronTrainStrategy
    from roll.workers.types import ForwardOutput, LossDefaults

    class TokenNLL(LossDefaults):
        def __call__(self, output: ForwardOutput, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
            return -(output.logp_BT * mb[C.RESPONSE_MASK].to(output.logp_BT.device)).sum(), {}

        def count_units(self, mb: Any) -> float:
            return float(mb[C.RESPONSE_MASK].sum())

    config = Qwen2Config(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    cfg = MegatronConfig(
        tensor_parallel_size=tp, precision="fp32", optimizer=OptimizerConfig(lr=1e-2), vocab_multiple=128
    )
    strategy = MegatronTrainStrategy(model, cfg, total_steps=1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 512, (4, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    ids = ids * mask
    loss_mask = mask.clone()
    loss_mask[torch.arange(4), mask.argmax(1)] = 0
    batch = {C.INPUT_IDS: ids, C.ATTENTION_MASK: mask, C.RESPONSE_MASK: loss_mask}
    logp = strategy.compute_logprobs(ids, mask).logp_BT.cpu()
    result = strategy.train_step(batch, TokenNLL())
    after = strategy.state_dict()
    digest = {k: float(v.double().sum()) for k, v in after.items()}
    return {"logp": logp.tolist(), "loss": result.loss, "grad_norm": result.grad_norm, "weights": digest}


def _launch(tp: int, tmp: Path) -> dict[str, Any]:
    """:func:`tp_run` in ``tp`` processes (``tests/gpu/tp_launch.py``); rank 0's result."""
    return dict(_tp_launch().launch(tp, tmp, Path(__file__), "tp_run"))


def _tp_launch() -> Any:
    """``tests/gpu/tp_launch.py`` (the tests folder is no package: found by path)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "gpu"))
    import tp_launch

    return tp_launch


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_MEGATRON, reason="Megatron-Core is not installed (roll-workers[megatron])")
def test_megatron_tp2_matches_tp1_on_one_batch(tmp_path: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("TP=2 needs two GPUs")
    one, two = _launch(1, tmp_path), _launch(2, tmp_path)
    _tp_launch().assert_same_step(one, two, "logp")
