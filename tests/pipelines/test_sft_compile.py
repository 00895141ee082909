"""SFT steps with the fsdp2 strategy's ``compile`` (each decoder layer ``torch.compile``-d, inductor on CPU) equal
the eager steps on tiny-1m and the built-in SFT task: the first micro-batch's gradients, both steps' losses (1e-6)
and the weights after; one graph serves micro-batches of every shape (``dynamic=True``), and a forward with a KV
cache runs eager (no graph per layer).

Slow tier: the one-off compile takes 20-40 s on 2 CPU cores."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM

from roll.core import columns as C
from roll.data.config import DataConfig, DatasetSourceConfig, TokenizeConfig
from roll.data.tiny import tiny_model_path
from roll.pipelines.common.data import load_tokenizer, prepare_data, sft_batch
from roll.pipelines.sft.losses import SFTLoss
from roll.workers.config import FSDP2Config, OptimizerConfig
from roll.workers.fsdp2 import FSDP2TrainStrategy

OPTIM = OptimizerConfig(lr=1e-2, eps=1e-3)
"""A large eps, as in tests/workers/test_fsdp2.py: Adam's first step is nearly ``lr * sign(g)`` with the default
1e-8, so a gradient that is ~0 would move its weight by up to the LR on a rounding difference."""


def _batches(count: int, rows: int) -> list[dict[str, Any]]:
    path = tiny_model_path("tiny-1m")
    tokenizer = load_tokenizer(str(path))
    source = DatasetSourceConfig(path="builtin:arithmetic", builtin_kind="sft", max_samples=count * rows)
    prepared = prepare_data(DataConfig(sources=[source]), TokenizeConfig(), kind="sft", tokenizer=tokenizer)
    out = []
    for i in range(count):
        batch = sft_batch(prepared.train[i * rows : (i + 1) * rows], pad_id=tokenizer.pad_token_id)
        out.append(
            {
                C.INPUT_IDS: batch[C.INPUT_IDS],
                C.ATTENTION_MASK: batch[C.ATTENTION_MASK],
                C.LABELS: batch[C.LABELS],
            }
        )
    return out


def _strategy(compiled: bool) -> FSDP2TrainStrategy:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path("tiny-1m")))
    config = FSDP2Config(device="cpu", micro_batch_size=5, optimizer=OPTIM, compile=compiled)
    return FSDP2TrainStrategy(model, config)


def _grads(strategy: FSDP2TrainStrategy, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    strategy.forward_backward(strategy.split(batch)[:1], SFTLoss())
    grads = {n: p.grad.clone() for n, p in strategy.model.named_parameters() if p.grad is not None}
    strategy.optimizer.zero_grad(set_to_none=True)
    return grads


@pytest.mark.slow
def test_compiled_sft_steps_equal_the_eager_steps() -> None:
    batches = _batches(count=2, rows=12)  # micro-batches of 5, 5 and 2 rows: three shapes per step
    eager, compiled = _strategy(False), _strategy(True)
    graphs_before = counters["stats"]["unique_graphs"]
    g_eager, g_compiled = _grads(eager, batches[0]), _grads(compiled, batches[0])
    assert g_compiled.keys() == g_eager.keys() and len(g_eager) > 0
    for name, grad in g_eager.items():
        torch.testing.assert_close(g_compiled[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    runs = [[s.train_step(dict(b), SFTLoss()) for b in batches] for s in (eager, compiled)]
    for a, b in zip(*runs, strict=True):
        assert b.loss == pytest.approx(a.loss, abs=1e-6)
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5)
    assert runs[0][1].loss != pytest.approx(
        runs[0][0].loss, abs=1e-3
    )  # the first step trained: this can fail
    compiled_params = dict(compiled.model.named_parameters())
    for name, value in eager.model.named_parameters():
        torch.testing.assert_close(compiled_params[name], value, atol=1e-6, rtol=0, msg=name)
    # one graph for every layer and every micro-batch shape, and a second for micro-batches without padding
    # (transformers passes them no attention mask): no recompile per shape, nothing fell back to eager
    graphs = counters["stats"]["unique_graphs"] - graphs_before
    assert 1 <= graphs <= 2
    # a forward with a KV cache (greedy evaluation, the shared-prefix path) runs eager: no graph per layer
    ids, mask = batches[0][C.INPUT_IDS][:2], batches[0][C.ATTENTION_MASK][:2]
    with torch.no_grad():
        cached = [s.model(input_ids=ids, attention_mask=mask, use_cache=True) for s in (eager, compiled)]
    assert cached[1].past_key_values is not None
    torch.testing.assert_close(cached[1].logits, cached[0].logits, atol=1e-5, rtol=0)
    assert counters["stats"]["unique_graphs"] - graphs_before == graphs
