"""Rows whose advantages are all 0 leave the training forward (``algorithm.skip_zero_advantage``) and the step is
unchanged: the same loss, gradient norm and weights as training on every row, with less work.

GRPO gives a group whose samples all scored the same advantages of exactly 0; every policy surrogate is the
advantage times a factor, so those rows add nothing to the loss or the gradient but their units to its normalizer.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from roll.core import columns as C
from roll.core.batch import Batch
from roll.pipelines.algorithms.losses import PolicyLoss
from roll.pipelines.algorithms.presets import preset_config
from roll.pipelines.policy.views import without_inert_rows
from roll.workers.config import FSDP2Config, OptimizerConfig
from roll.workers.fsdp2 import FSDP2TrainStrategy
from roll.workers.roles._common import micro_batch

GROUPS, SAMPLES, WIDTH = 4, 4, 10


def grpo_rows(seed: int = 0) -> Batch:
    """``GROUPS`` groups of ``SAMPLES`` rows: a 4-token prompt, 2..5 response tokens, right padding. Groups 1 and 3
    have advantage 0 on every token (their samples scored alike); groups 0 and 2 have nonzero per-row advantages.
    """
    g = torch.Generator().manual_seed(seed)
    B = GROUPS * SAMPLES
    lengths_B = 4 + torch.randint(2, 6, (B,), generator=g)
    attention_BT = (torch.arange(WIDTH)[None, :] < lengths_B[:, None]).long()
    response_BT = attention_BT.clone()
    response_BT[:, :4] = 0
    adv_B = torch.randn(B, generator=g)
    adv_B[SAMPLES : 2 * SAMPLES] = 0.0
    adv_B[3 * SAMPLES :] = 0.0
    return Batch(
        {
            C.INPUT_IDS: torch.randint(1, 128, (B, WIDTH), generator=g) * attention_BT,
            C.ATTENTION_MASK: attention_BT,
            C.RESPONSE_MASK: response_BT,
            C.ADVANTAGES: adv_B[:, None] * response_BT.float(),
        }
    )


def strategy() -> FSDP2TrainStrategy:
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
        )
    )  # fmt: skip
    optimizer = OptimizerConfig(lr=1e-2, eps=1e-3)  # see tests/workers/test_fsdp2.py: OPTIM
    cfg = {"device": "cpu", "optimizer": optimizer, "max_grad_norm": 1.0, "micro_batch_size": 6}
    return FSDP2TrainStrategy(model, FSDP2Config.model_validate(cfg))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_left_out_rows_change_nothing_but_the_work(mode: str) -> None:
    """Two steps on all 16 rows and on the 8 live ones (units carried) end at the same weights; each step's loss,
    gradient norm and unit count agree, and the embedding saw half the rows."""
    loss = PolicyLoss(
        preset_config("grpo", kl_mode="none", kl_coef=0.0, loss_agg_mode=mode), norm_len=6, use_old_logp=False
    )
    runs = {}
    for skip in (False, True):
        s, seen = strategy(), []
        s.model.get_input_embeddings().register_forward_hook(
            lambda m, a, o, seen=seen: seen.append(len(a[0]))
        )
        results = []
        for seed in range(2):
            batch = grpo_rows(seed)
            if skip:
                batch, left_out = without_inert_rows(batch, loss)
                assert left_out == 2 * SAMPLES
            results.append(s.train_step(micro_batch(batch), loss))
        runs[skip] = (results, s.state_dict(), sum(seen))
    (full, full_params, full_rows), (cut, cut_params, cut_rows) = runs[False], runs[True]
    for a, b in zip(full, cut):
        assert b.num_units == a.num_units
        assert b.loss == pytest.approx(a.loss, abs=1e-6)
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5)
        assert a.grad_norm > 0
    for name, value in full_params.items():
        torch.testing.assert_close(cut_params[name], value, atol=1e-6, rtol=0, msg=name)
    assert cut_rows * 2 == full_rows


def test_units_are_carried_whole_and_one_row_always_stays() -> None:
    loss = PolicyLoss(preset_config("grpo", kl_mode="none", kl_coef=0.0), norm_len=6, use_old_logp=False)
    batch = grpo_rows()
    kept, left_out = without_inert_rows(batch, loss)
    assert (left_out, len(kept)) == (8, 8)
    carried_B = kept.tensors[C.CARRIED_UNITS]
    assert torch.equal(carried_B, carried_B.round())  # whole tokens per row
    assert loss.count_units(kept.tensors) == loss.count_units(batch.tensors)

    batch[C.ADVANTAGES] = torch.zeros_like(batch.tensors[C.ADVANTAGES])  # every group scored alike
    kept, left_out = without_inert_rows(batch, loss)
    assert (left_out, len(kept)) == (15, 1)
    assert loss.count_units(kept.tensors) == loss.count_units(batch.tensors)


@pytest.mark.parametrize(
    "change", [{"kl_mode": "loss", "kl_coef": 0.1}, {"entropy_coef": 0.01}, {"skip_zero_advantage": False}]
)
def test_no_row_is_inert_when_a_term_pulls_on_every_row(change: dict[str, object]) -> None:
    """A KL loss or an entropy bonus has a gradient on rows with advantage 0; and the switch turns it off."""
    algo = preset_config("grpo", **{"kl_mode": "none", "kl_coef": 0.0, **change})
    loss = PolicyLoss(algo, norm_len=6, use_old_logp=False)
    kept, left_out = without_inert_rows(grpo_rows(), loss)
    assert (left_out, len(kept)) == (0, GROUPS * SAMPLES)
