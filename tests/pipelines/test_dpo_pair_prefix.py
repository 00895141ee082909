"""DPO steps with the fsdp2 strategy's ``pair_prefix`` (each chosen/rejected pair one row, the common prefix once)
equal the plain steps on the built-in preference task: losses to 1e-6, the loss's metrics, the weights after."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from roll.core import columns as C
from roll.data.config import DataConfig, DatasetSourceConfig, TokenizeConfig
from roll.data.tokenizer import build_tokenizer
from roll.pipelines.common.data import pair_batch, prepare_data
from roll.pipelines.dpo.losses import DPOLoss, response_logp
from roll.workers.config import FSDP2Config, OptimizerConfig
from roll.workers.fsdp2 import FSDP2TrainStrategy

OPTIM = OptimizerConfig(lr=1e-2, eps=1e-3)
"""A large eps, as in tests/workers/test_fsdp2.py: with Adam's 1e-8 an entry whose gradient is ~0 moves by up to
the LR on a float-rounding difference, which would compare rounding instead of the gradients."""


def _model(vocab: int, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=256,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg)


def _steps(paired: bool, batches: list[dict[str, Any]], vocab: int) -> tuple[list[Any], dict[str, Any], int]:
    config = FSDP2Config(device="cpu", micro_batch_size=8, optimizer=OPTIM, pair_prefix=paired)
    strategy = FSDP2TrainStrategy(_model(vocab), config)
    seen: list[int] = []
    strategy.model.get_input_embeddings().register_forward_hook(lambda m, a, o: seen.append(a[0].numel()))
    results = [strategy.train_step(dict(b), DPOLoss(beta=0.1)) for b in batches]
    params = {k: v.detach().clone() for k, v in strategy.model.state_dict().items()}
    return results, params, sum(seen)


def test_dpo_steps_equal_the_plain_steps_with_less_work() -> None:
    tokenizer = build_tokenizer()
    source = DatasetSourceConfig(path="builtin:arithmetic", builtin_kind="preference", max_samples=32)
    rows = prepare_data(
        DataConfig(sources=[source]), TokenizeConfig(), kind="preference", tokenizer=tokenizer
    ).train
    vocab = len(tokenizer)
    # another init than the policy's: at equal weights every margin is exactly 0 on the plain path and ~1e-7 on
    # the pair path, and the reward accuracy (a step function of the margin) would compare float rounding
    reference = _model(vocab, seed=1).eval()
    batches = []
    for i in range(2):
        batch = pair_batch(rows[i * 8 : (i + 1) * 8], pad_id=tokenizer.pad_token_id)
        tensors = {
            C.INPUT_IDS: batch[C.INPUT_IDS],
            C.ATTENTION_MASK: batch[C.ATTENTION_MASK],
            C.LABELS: batch[C.LABELS],
        }
        with torch.no_grad():
            logp_BT = _plain_logp(reference, tensors[C.INPUT_IDS], tensors[C.ATTENTION_MASK])
        tensors[C.REF_SEQ_LOGP] = response_logp(logp_BT, batch[C.LABELS])
        batches.append(tensors)
    plain, plain_params, plain_positions = _steps(False, batches, vocab)
    paired, paired_params, paired_positions = _steps(True, batches, vocab)
    for a, b in zip(plain, paired, strict=True):
        assert b.loss == pytest.approx(a.loss, abs=1e-6)
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5)
        assert b.metrics.keys() == a.metrics.keys()
        for key in a.metrics:
            assert b.metrics[key] == pytest.approx(a.metrics[key], abs=1e-5)
    for name, value in plain_params.items():
        torch.testing.assert_close(paired_params[name], value, atol=1e-6, rtol=0, msg=name)
    assert plain[1].loss != pytest.approx(
        plain[0].loss, abs=1e-4
    )  # the first step trained: the check can fail
    assert paired_positions < 0.8 * plain_positions  # each prompt ran once per pair


def _plain_logp(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    from roll.workers.logprobs import forward_scores

    return forward_scores(model, ids, mask)[0]
