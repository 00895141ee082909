"""Megatron in the pipelines' trainable roles: PPO's critic, the reward-model trainer, the DPO trainer, and the
distillation student (offline, and on-policy, where it is RLVR's ``actor_train``).

CPU part: every role's row methods dispatch by model-parallel group; ``strategy: {type: megatron}`` validates in
each role, and a ``num_workers`` that cannot hold the TP x PP groups is an error naming that role's key (the
critic's too when it inherits ``actor_train``'s strategy); the student's Megatron reader, fed the logits of a
tiny Qwen2 on left-aligned rows, gives exactly what its transformers forward gives on the padded rows.

GPU part (``gpu``; Megatron-Core): a TP=1 student gives its HF model's log-probs and logits and one distillation
step lowers the loss; with two GPUs TP=2 gives TP=1's loss, grad norm and updated weights.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core.cli import load_run_config
from roll.core.errors import ConfigError
from roll.pipelines.distill.losses import STUDENT_FORWARD, student_forward, student_megatron_read
from roll.workers import megatron_heads
from roll.workers.megatron_heads import StageOutput, align_left

EXAMPLES = Path(__file__).parents[2] / "examples"
HAS_MEGATRON = importlib.util.find_spec("megatron") is not None
TP2 = "{type: megatron, tensor_parallel_size: 2}"


def test_trained_roles_dispatch_rows_by_model_parallel_group() -> None:
    """The student's step, transfer and evaluation; the actor (DPO's trainer, the on-policy student)."""
    from roll.core.cluster import (
        Dispatch,  # imports Ray: inside, so the gpu tests collect where Ray is absent
    )
    from roll.core.cluster.dispatch import get_spec, registered_functions
    from roll.pipelines.distill.worker import DistillStudentWorker
    from roll.workers.roles.actor import ActorTrainWorker

    student, actor = registered_functions(DistillStudentWorker), registered_functions(ActorTrainWorker)
    methods = [
        student["train_distill"], student["received_topk"], student["eval_distill"], student["eval_step"],
        actor["train_step"], actor["compute_logprobs"],
    ]  # fmt: skip
    assert [get_spec(m).mode for m in methods] == [Dispatch.MP_SPLIT] * len(methods)  # type: ignore[union-attr]
    assert STUDENT_FORWARD.megatron.kind == "lm" and STUDENT_FORWARD.hf is student_forward


@pytest.mark.parametrize(
    ("example", "role", "workers"),
    [
        ("ppo", "critic", 2),
        ("reward_model", "actor_train", 2),
        ("dpo", "actor_train", 2),
        ("distill", "student", 2),
        ("distill_onpolicy", "actor_train", 2),
    ],
)
def test_megatron_validates_in_the_role_and_a_bad_worker_count_names_its_key(
    example: str, role: str, workers: int
) -> None:
    """TP=2 on 2 workers is one data-parallel replica; on 3 workers the groups do not fit, and the error names
    ``<role>.num_workers`` with the product and a fix."""
    path = EXAMPLES / f"{example}.yaml"
    _, config = load_run_config(path, [f"{role}.strategy={TP2}", f"{role}.num_workers={workers}"])
    section = getattr(config, role)
    assert section.strategy.type == "megatron" and section.data_parallel_size() == 1
    with pytest.raises(ConfigError, match=rf"{role}(\.strategy)?.*num_workers = 3 .* = 2 \* 1"):
        load_run_config(path, [f"{role}.strategy={TP2}", f"{role}.num_workers=3"])


def test_critic_inheriting_a_megatron_strategy_is_checked_and_meshed() -> None:
    """``critic.strategy`` unset: the critic trains with ``actor_train``'s (TP=2 here), so 1 critic worker is an
    error at ``critic.num_workers``; with 2 its mesh is TP=2 (one DP rank, results from rank 0)."""
    from roll.core.cluster import Mesh
    from roll.core.config.loader import load_tree, validate
    from roll.pipelines.policy.group import policy_spec

    path = EXAMPLES / "ppo.yaml"
    spec, _ = load_run_config(path, [])

    def with_critic_workers(n: int) -> Any:
        tree = load_tree(path, [])
        del tree.data["critic"]["strategy"]  # the example gives its critic an fsdp2 strategy of its own
        tree.data["critic"]["num_workers"] = n
        tree.data["actor_train"].update({"strategy": {"type": "megatron", "tensor_parallel_size": 2}})
        tree.data["actor_train"]["num_workers"] = 2
        return validate(tree, spec.config_model)

    with pytest.raises(ConfigError, match=r"critic\.num_workers.*critic\.strategy is unset"):
        with_critic_workers(1)
    policy = policy_spec(with_critic_workers(2), warmup_steps=0, norm_len=8)
    assert policy.critic is not None and policy.critic.role.strategy.type == "megatron"
    assert Mesh.for_role(policy.critic.role) == Mesh(2, tp=2)


def test_student_megatron_reader_equals_its_transformers_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny Qwen2 run on the left-aligned rows (what Megatron is fed) gives, through the reader (TP=1: the vocab
    gather is the identity), the padded rows' ``logits_BTV`` (where a token is predicted) and ``logp_BT`` of
    :func:`student_forward`: causal attention makes a row's logits independent of the padding after it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    ids = torch.randint(1, 64, (3, 6)) * mask
    aligned = align_left(ids, mask)
    aligned_mask = torch.arange(6)[None] < mask.sum(-1, keepdim=True)
    monkeypatch.setattr(megatron_heads, "gather_vocab", lambda logits: logits)
    with torch.no_grad():
        logits = model(input_ids=aligned.ids_BT, attention_mask=aligned_mask.long()).logits
        ours = student_megatron_read(StageOutput(logits, aligned, vocab_size=64), 0.7, False)
        theirs = student_forward(model, ids, mask, False, 0.7)
    predicted = torch.zeros_like(mask, dtype=torch.bool)
    predicted[:, 1:] = mask[:, :-1].bool() & mask[:, 1:].bool()
    assert ours.logits_BTV is not None and theirs.logits_BTV is not None
    torch.testing.assert_close(ours.logits_BTV[predicted], theirs.logits_BTV[predicted], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.logp_BT, theirs.logp_BT, atol=1e-5, rtol=1e-5)
    assert bool((ours.logp_BT[~predicted] == 0).all())


# ---- GPU --------------------------------------------------------------------------------------------------------


def student_tp_run(tp: int) -> dict[str, Any]:
    """One fp32 Megatron distillation step (forward KL to a fixed random top-8) at tensor parallel size ``tp``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from roll.core import columns as C
    from roll.pipelines.distill.losses import DistillLoss
    from roll.workers.config import OptimizerConfig
    from roll.workers.gpu_specs import MEGATRON
    from roll.workers.megatron_config import MegatronConfig

    config = Qwen2Config(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    cfg = MegatronConfig(tensor_parallel_size=tp, precision="fp32", optimizer=OptimizerConfig(lr=1e-3))
    strategy = MEGATRON.build(cfg, model, total_steps=1, forward=STUDENT_FORWARD)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 512, (4, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    batch = {
        C.INPUT_IDS: ids * mask, C.ATTENTION_MASK: mask, C.LABELS: ids * mask,
        C.TOPK_VALUES: torch.randn(4, 16, 8, generator=g), C.TOPK_INDICES: torch.randint(0, 512, (4, 16, 8), generator=g),
    }  # fmt: skip
    loss = DistillLoss().bind(batch)
    before = strategy.forward_only(ids * mask, mask)
    with torch.no_grad():
        hf = student_forward(model.cuda().float().eval(), (ids * mask).cuda(), mask.cuda(), False, 1.0)
    result = strategy.train_step(batch, loss)
    after = strategy.forward_only(ids * mask, mask)
    digest = {k: float(v.double().sum()) for k, v in strategy.state_dict().items()}
    return {
        "logp": before.logp_BT.cpu().tolist(), "hf_logp": hf.logp_BT.cpu().tolist(), "loss": result.loss,
        "loss_after": float(loss(after, {k: v.cuda() for k, v in batch.items()})[0]),
        "grad_norm": result.grad_norm, "weights": digest,
    }  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_MEGATRON and torch.cuda.is_available()), reason="needs Megatron-Core and CUDA")
def test_megatron_student_tp1_gives_the_hf_logprobs_and_learns() -> None:
    one = student_tp_run(1)
    torch.testing.assert_close(torch.tensor(one["logp"]), torch.tensor(one["hf_logp"]), atol=1e-3, rtol=1e-3)
    assert one["loss_after"] < one["loss"]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_MEGATRON, reason="Megatron-Core is not installed (roll-workers[megatron])")
def test_megatron_student_tp2_matches_tp1(tmp_path: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("TP=2 needs two GPUs")
    _tp_launch().assert_tp2_matches_tp1(tmp_path, Path(__file__), "student_tp_run", "logp")


def _tp_launch() -> Any:
    """``tests/gpu/tp_launch.py`` (the tests folder is no package: found by path)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "gpu"))
    import tp_launch

    return tp_launch


def test_sft_evaluation_under_megatron_says_to_turn_it_off() -> None:
    """SFT's (and the offline student's) held-out accuracy and greedy answers run a transformers forward; a role
    whose strategy holds a Megatron model gets an error naming the role, the method and the fix, not a TypeError
    from inside Megatron's forward."""
    from types import SimpleNamespace

    from roll.core.errors import WorkerError
    from roll.pipelines.sft.worker import SFTEvaluation

    megatron_like = SimpleNamespace(strategy=SimpleNamespace(model=torch.nn.Linear(1, 1)), role="student")
    megatron_like.spec = SimpleNamespace(strategy=SimpleNamespace(type="megatron"))
    evaluation = SFTEvaluation(megatron_like)  # type: ignore[arg-type]
    with pytest.raises(WorkerError, match=r"student\.eval_step: .*'megatron'.*eval_every: 0"):
        evaluation._transformers_model("eval_step")
