"""FSDP2TrainStrategy on CPU: exact accumulation, packing, schedules, state round trips, LoRA, two ranks."""

from __future__ import annotations

import math
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import start_processes
from transformers import Qwen2Config, Qwen2ForCausalLM

from roll.core import columns as C
from roll.core.errors import CheckpointError
from roll.workers.config import FSDP2Config, LoraConfig, OptimizerConfig, SchedulerConfig
from roll.workers.fsdp2 import FSDP2TrainStrategy, lr_multiplier
from roll.workers.specs import FSDP2
from roll.workers.types import ForwardOutput, LossDefaults, LossFn, MicroBatch, TrainStrategy


def tiny_model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
    )
    return Qwen2ForCausalLM(cfg)


class TokenMeanNLL(LossDefaults):
    """SFT loss: summed negative log-likelihood over ``response_mask_BT`` tokens; units are those tokens."""

    def __call__(
        self, output: ForwardOutput, micro_batch: MicroBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return -(output.logp_BT * micro_batch[C.RESPONSE_MASK]).sum(), {}

    def count_units(self, micro_batch: MicroBatch) -> float:
        return float(micro_batch[C.RESPONSE_MASK].sum())


class ScoredNLL(TokenMeanNLL):
    """The same loss, telling the strategy it reads only the ``response_mask_BT`` positions (``score_mask``)."""

    def score_mask(self, micro_batch: MicroBatch) -> torch.Tensor:
        return micro_batch[C.RESPONSE_MASK].bool()


def make_batch(rows: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded rows of lengths 4..12, the loss on every predicted token."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 13, (rows,), generator=g)
    ids = torch.randint(1, 128, (rows, 12), generator=g)
    mask = (torch.arange(12)[None, :] < lengths[:, None]).long()
    loss_mask = mask.clone()
    loss_mask[:, 0] = 0
    return {C.INPUT_IDS: ids * mask, C.ATTENTION_MASK: mask, C.RESPONSE_MASK: loss_mask}


OPTIM = OptimizerConfig(lr=1e-2, eps=1e-3)
"""A large Adam ``eps``: Adam's first step is ``lr * g / (|g| + eps)``, nearly ``lr * sign(g)``, so gradients that
agree to 1e-8 (summation order differs between accumulation schemes) but are themselves ~1e-8 (k_proj.bias has an
exactly-zero true gradient) would give updates differing by ``lr``. With ``eps=1e-3`` the update is Lipschitz in
``g`` (gain ``lr / eps = 10``) and equal gradients give equal parameters to ~1e-7."""


def config(**kw: object) -> FSDP2Config:
    base: dict[str, object] = {"device": "cpu", "optimizer": OPTIM, "max_grad_norm": 1.0}
    base.update(kw)
    return FSDP2Config.model_validate(base)


def params_of(strategy: FSDP2TrainStrategy) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in strategy.state_dict().items()}


def assert_params_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, msg=name)


def test_satisfies_protocols_and_spec() -> None:
    strategy = FSDP2TrainStrategy(tiny_model(), config())
    assert isinstance(strategy, TrainStrategy) and isinstance(TokenMeanNLL(), LossFn)
    assert FSDP2.kind == "train" and FSDP2.config_model is FSDP2Config


def test_accumulating_4x2_equals_one_batch_of_8() -> None:
    batch = make_batch()
    big = FSDP2TrainStrategy(tiny_model(), config())
    small = FSDP2TrainStrategy(tiny_model(), config(micro_batch_size=2))
    r_big, r_small = big.train_step(batch, TokenMeanNLL()), small.train_step(batch, TokenMeanNLL())
    assert r_small.num_micro_batches == 4 and r_big.num_micro_batches == 1
    assert r_small.loss == pytest.approx(r_big.loss, abs=1e-6)
    assert r_small.grad_norm == pytest.approx(r_big.grad_norm, rel=1e-5)
    assert_params_close(params_of(big), params_of(small), atol=1e-6)


def test_token_budget_micro_batches_equal_one_batch() -> None:
    batch = make_batch()
    big = FSDP2TrainStrategy(tiny_model(), config())
    budget = FSDP2TrainStrategy(tiny_model(), config(max_tokens_per_micro_batch=20))
    big.train_step(batch, TokenMeanNLL())
    assert budget.train_step(batch, TokenMeanNLL()).num_micro_batches > 2
    assert_params_close(params_of(big), params_of(budget), atol=1e-6)


def test_packed_equals_padded() -> None:
    batch = make_batch()
    padded = FSDP2TrainStrategy(tiny_model(), config())
    packed = FSDP2TrainStrategy(tiny_model(), config(packed=True))
    r_pad, r_pack = padded.train_step(batch, TokenMeanNLL()), packed.train_step(batch, TokenMeanNLL())
    assert r_pack.loss == pytest.approx(r_pad.loss, abs=1e-5)
    assert_params_close(params_of(padded), params_of(packed), atol=1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_score_mask_projects_only_loss_positions_and_changes_nothing(packed: bool) -> None:
    batch = make_batch()
    batch[C.RESPONSE_MASK][:, :4] = 0  # a 4-token "prompt": no logits needed there
    full = FSDP2TrainStrategy(tiny_model(), config(micro_batch_size=3, packed=packed))
    scored = FSDP2TrainStrategy(tiny_model(), config(micro_batch_size=3, packed=packed))
    rows: list[int] = []
    head = scored.model.get_output_embeddings()
    head.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[-2]))
    for _ in range(2):
        r_full, r_scored = full.train_step(batch, TokenMeanNLL()), scored.train_step(batch, ScoredNLL())
        assert r_scored.loss == pytest.approx(r_full.loss, abs=1e-6)
        assert r_scored.grad_norm == pytest.approx(r_full.grad_norm, rel=1e-5)
    assert sum(rows) == 2 * int(batch[C.RESPONSE_MASK].sum())  # the projection ran on the loss positions only
    assert_params_close(params_of(full), params_of(scored), atol=1e-6)


def test_loss_goes_down_and_every_parameter_changes() -> None:
    batch = make_batch()
    strategy = FSDP2TrainStrategy(tiny_model(), config(gradient_checkpointing=True))
    before = params_of(strategy)
    losses = [strategy.train_step(batch, TokenMeanNLL()).loss for _ in range(5)]
    assert losses[-1] < losses[0] - 0.5, losses
    after = params_of(strategy)
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged


def test_lr_schedule_golden_values() -> None:
    """Warmup 2 then cosine to 0.1 over 6 steps: step 0 -> 1/2, 1 -> 1, then 0.1 + 0.45 (1 + cos(pi p)) with
    p = (s - 2) / 4: s=2 -> 1, s=3 -> 0.1 + 0.45 (1 + 0.70711) = 0.86820, s=4 -> 0.55, s=5 -> 0.23180, s=6 -> 0.1.
    Linear without warmup over 4 steps: 1, 0.75, 0.5, 0.25, then 0 (clamped)."""
    cosine = SchedulerConfig(kind="cosine", warmup_steps=2, min_lr_ratio=0.1)
    got = [lr_multiplier(s, cosine, 6) for s in range(8)]
    assert got == pytest.approx([0.5, 1.0, 1.0, 0.868198, 0.55, 0.231802, 0.1, 0.1], abs=1e-6)
    linear = SchedulerConfig(kind="linear")
    assert [lr_multiplier(s, linear, 4) for s in range(5)] == pytest.approx([1, 0.75, 0.5, 0.25, 0])
    strategy = FSDP2TrainStrategy(tiny_model(), config(scheduler=cosine), total_steps=6)
    lrs = [strategy.train_step(make_batch(2), TokenMeanNLL()).lr for _ in range(4)]
    assert lrs == pytest.approx([1e-2 * m for m in got[:4]])
    assert math.isclose(lr_multiplier(3, SchedulerConfig(), 4), 1.0)


def test_set_lr_rebases_the_schedule() -> None:
    """Linear decay over 4 steps from 1e-2: after two steps (1e-2, 7.5e-3) the next rate is 5e-3; ``set_lr(1e-3)``
    makes the next step use 1e-3 itself and the one after 1e-3 * 0.25 (step 3 of 4: multiplier 0.25)."""
    strategy = FSDP2TrainStrategy(
        tiny_model(), config(scheduler=SchedulerConfig(kind="linear")), total_steps=4
    )
    for _ in range(2):
        strategy.train_step(make_batch(2), TokenMeanNLL())
    assert strategy.lr == pytest.approx(5e-3)
    strategy.set_lr(1e-3)
    lrs = [strategy.train_step(make_batch(2), TokenMeanNLL()).lr for _ in range(2)]
    assert lrs == pytest.approx([1e-3, 2.5e-4])


def test_model_state_dict_round_trip_restores_weights_and_lora_names() -> None:
    """The checkpoint state keeps peft names under LoRA (so training resumes with the adapter) and loads back."""
    cfg = config(lora=LoraConfig(r=2, alpha=4, target_modules=["q_proj"]))
    a = FSDP2TrainStrategy(tiny_model(), cfg)
    a.train_step(make_batch(), TokenMeanNLL())
    state = a.model_state_dict()
    assert any(".lora_A." in name for name in state)
    b = FSDP2TrainStrategy(tiny_model(1), cfg)
    b.load_model_state_dict(state)
    assert_params_close(params_of(a), params_of(b), atol=0)


def test_optimizer_state_round_trip_gives_identical_next_step(tmp_path: Path) -> None:
    cfg = config(scheduler=SchedulerConfig(kind="linear", warmup_steps=1))
    a = FSDP2TrainStrategy(tiny_model(), cfg, total_steps=5)
    for seed in range(2):
        a.train_step(make_batch(seed=seed), TokenMeanNLL())
    a.save_optimizer(tmp_path / "optim.pt")
    b_model = tiny_model(1)
    b_model.load_state_dict(a.state_dict())
    b = FSDP2TrainStrategy(b_model, cfg, total_steps=5)
    b.load_optimizer(tmp_path / "optim.pt")
    ra, rb = (
        a.train_step(make_batch(seed=9), TokenMeanNLL()),
        b.train_step(make_batch(seed=9), TokenMeanNLL()),
    )
    assert ra.lr == rb.lr
    assert_params_close(params_of(a), params_of(b), atol=0)


def test_saving_before_the_first_step_changes_nothing(tmp_path: Path) -> None:
    """A checkpoint taken before any step (e.g. step 0 of a run) neither alters the saver's next update nor gives a
    restored optimizer a state the fresh one lacks: three strategies from one model take identical steps."""
    cfg = config()
    plain, saver, restored = (FSDP2TrainStrategy(tiny_model(), cfg) for _ in range(3))
    restored.train_step(make_batch(seed=3), TokenMeanNLL())  # give it a state that the load must clear
    saver.save_optimizer(tmp_path / "optim.pt")
    restored.model.load_state_dict(plain.model.state_dict())
    restored.load_optimizer(tmp_path / "optim.pt")
    for seed in range(2):
        for strategy in (plain, saver, restored):
            strategy.train_step(make_batch(seed=seed), TokenMeanNLL())
    assert_params_close(params_of(saver), params_of(plain), atol=0)
    assert_params_close(params_of(restored), params_of(plain), atol=0)


def test_a_checkpoint_of_non_finite_weights_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    """The trainer's checkpoint writer (roles.checkpoint.save, what fsdp2 and megatron actors call) checks the
    full state before writing: one NaN in a layer's weight fails the save naming that tensor, and nothing is
    written; the same strategy with finite weights saves."""
    from roll.workers.roles import checkpoint

    strategy = FSDP2TrainStrategy(tiny_model(), config())
    checkpoint.save(strategy, tmp_path / "good", rank=0)
    assert (tmp_path / "good" / checkpoint.MODEL_FILE).is_file()
    with torch.no_grad():
        strategy.model.get_parameter("model.layers.1.mlp.up_proj.weight")[3, 5] = float("nan")
    with pytest.raises(CheckpointError) as info:
        checkpoint.save(strategy, tmp_path / "bad", rank=0)
    assert str(info.value) == (
        f"refusing to save the model to {tmp_path / 'bad'}: tensor model.layers.1.mlp.up_proj.weight (1 of 8192 "
        "values are NaN or inf); the weights diverged (nothing was written)"
    )
    assert not (tmp_path / "bad").exists()


def test_export_hf_round_trips_through_from_pretrained(tmp_path: Path) -> None:
    strategy = FSDP2TrainStrategy(tiny_model(), config())
    strategy.train_step(make_batch(), TokenMeanNLL())
    strategy.export_hf(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").exists()
    loaded = Qwen2ForCausalLM.from_pretrained(tmp_path / "hf")
    assert_params_close(dict(loaded.state_dict()), params_of(strategy), atol=0)


def test_lora_trains_only_adapters_and_exports_them(tmp_path: Path) -> None:
    cfg = config(lora=LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    strategy = FSDP2TrainStrategy(tiny_model(), cfg)
    raw_before = {k: v.clone() for k, v in strategy.model.state_dict().items()}
    merged_before = strategy.state_dict()
    assert_params_close(merged_before, dict(tiny_model().state_dict()), atol=0)  # B = 0 at init
    for _ in range(2):
        strategy.train_step(make_batch(), TokenMeanNLL())
    raw_after = strategy.model.state_dict()
    changed = {k for k in raw_before if not torch.equal(raw_before[k], raw_after[k])}
    assert changed and all(".lora_" in k for k in changed)
    assert any(".lora_B." in k for k in changed)
    merged_after = strategy.state_dict()
    assert not torch.equal(
        merged_after["model.layers.0.self_attn.q_proj.weight"],
        merged_before["model.layers.0.self_attn.q_proj.weight"],
    )
    torch.testing.assert_close(
        merged_after["model.layers.0.mlp.up_proj.weight"], merged_before["model.layers.0.mlp.up_proj.weight"]
    )
    strategy.export_hf(tmp_path / "lora")
    assert (tmp_path / "lora" / "adapter_model.safetensors").exists()
    assert not (tmp_path / "lora" / "model.safetensors").exists()


def test_bf16_on_one_cpu_rank_runs_bf16_matmuls_on_fp32_weights() -> None:
    """``mixed_precision: bf16`` on one CPU rank trains under bf16 autocast (it used to be ignored there): the head's
    matmul runs in bf16, log-probs come back float32, weights and their gradients stay float32, the loss is within
    bf16 rounding of fp32's (bf16 keeps 8 bits of mantissa: ~0.4% per value) without equalling it, and it learns."""
    batch = make_batch()
    fp32 = FSDP2TrainStrategy(tiny_model(), config())
    bf16 = FSDP2TrainStrategy(tiny_model(), config(mixed_precision="bf16"))
    head_dtypes: list[torch.dtype] = []
    bf16.model.get_output_embeddings().register_forward_hook(lambda m, a, out: head_dtypes.append(out.dtype))
    scores = bf16.compute_logprobs(batch[C.INPUT_IDS], batch[C.ATTENTION_MASK])
    assert head_dtypes == [torch.bfloat16] and scores.logp_BT.dtype == torch.float32
    r32, r16 = fp32.train_step(batch, TokenMeanNLL()), bf16.train_step(batch, TokenMeanNLL())
    assert r16.loss != r32.loss and r16.loss == pytest.approx(r32.loss, rel=1e-2)
    assert {p.dtype for p in bf16.model.parameters()} == {torch.float32}
    losses = [bf16.train_step(batch, TokenMeanNLL()).loss for _ in range(4)]
    assert losses[-1] < r16.loss - 0.5, (r16.loss, losses)


def test_compute_logprobs_matches_training_forward() -> None:
    batch = make_batch()
    strategy = FSDP2TrainStrategy(tiny_model(), config(micro_batch_size=3))
    scores = strategy.compute_logprobs(batch[C.INPUT_IDS], batch[C.ATTENTION_MASK], with_entropy=True)
    assert scores.logp_BT.shape == (8, 12) and scores.entropy_BT is not None
    nll = -(scores.logp_BT * batch[C.RESPONSE_MASK]).sum() / batch[C.RESPONSE_MASK].sum()
    result = strategy.train_step(batch, TokenMeanNLL())
    assert result.loss == pytest.approx(float(nll), abs=1e-5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _two_rank_worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        strategy = FSDP2TrainStrategy(tiny_model(), config(micro_batch_size=2 + 2 * rank), total_steps=3)
        for step in range(3):
            batch = make_batch(seed=step)
            half = {k: v[rank * 4 : (rank + 1) * 4] for k, v in batch.items()}
            strategy.train_step(half, ScoredNLL())  # score_mask under FSDP2: the head is sharded
        sd = strategy.state_dict()
        if rank == 0:
            torch.save(sd, Path(out_dir) / "two_ranks.pt")
        _save_with_a_nan_in_rank_1s_shard(strategy, rank, Path(out_dir))
    finally:
        dist.destroy_process_group()


NAN_PARAM = "model.layers.1.mlp.up_proj.weight"


def _save_with_a_nan_in_rank_1s_shard(strategy: FSDP2TrainStrategy, rank: int, out: Path) -> None:
    """Rank 1 puts a NaN in its shard (global row 64 of 128); the checkpoint must be refused on both ranks (rank 0
    sees it in the gathered state and its verdict is broadcast), so neither waits at a barrier for the other."""
    from roll.workers.roles import checkpoint

    if rank == 1:
        with torch.no_grad():
            strategy.model.get_parameter(NAN_PARAM).to_local()[0, 0] = float("nan")
    try:
        checkpoint.save(strategy, out / "nan", rank)
    except CheckpointError as err:
        (out / f"refused_rank{rank}.txt").write_text(str(err))


def test_two_ranks_with_half_batches_equal_one_rank(tmp_path: Path) -> None:
    """Rank 0 uses micro-batches of 2 and rank 1 of 4, so the ranks also run different micro-batch counts.
    Afterwards the same two ranks try a checkpoint with a NaN in rank 1's shard (see the helper)."""
    args = (_free_port(), str(tmp_path))
    start_processes(_two_rank_worker, args=args, nprocs=2, start_method="fork")  # type: ignore[no-untyped-call]
    single = FSDP2TrainStrategy(tiny_model(), config(), total_steps=3)
    for step in range(3):
        single.train_step(make_batch(seed=step), TokenMeanNLL())
    assert_params_close(torch.load(tmp_path / "two_ranks.pt"), params_of(single), atol=1e-5)
    for rank in (0, 1):  # then: a NaN in rank 1's shard alone refuses the checkpoint on both ranks
        assert (tmp_path / f"refused_rank{rank}.txt").read_text() == (
            f"refusing to save the model to {tmp_path / 'nan'}: tensor {NAN_PARAM} (1 of 8192 values are NaN or "
            "inf); the weights diverged (nothing was written)"
        )
    assert not (tmp_path / "nan").exists()


def test_compile_without_decoder_layers_is_refused_naming_the_model() -> None:
    from roll.core.errors import WorkerError

    with pytest.raises(WorkerError, match="compile: found no decoder layers to compile in Linear"):
        FSDP2TrainStrategy(torch.nn.Linear(4, 4), config(compile=True))
