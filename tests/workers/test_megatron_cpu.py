"""Real Megatron-Core ``GPTModel``s on CPU (gloo), TP=1 and TP=2: built and loaded by the megatron strategy's own
functions, read by its heads, against the HF models whose weights they hold. Marked ``megatron``: skipped without
Megatron-Core (the default environment); ``bash .ci/megatron`` runs them.

Megatron-Core's forward hard-codes CUDA in three places (the rotary embedding moves its frequencies to
``torch.cuda.current_device()``, the default causal mask is built on ``"cuda"``, and attention enters the CUDA RNG
tracker's ``fork()`` even without dropout), which the strategy's CPU mode replaces (:mod:`roll.workers.megatron_device`,
used here as the strategy uses it; the strategy's own steps on CPU are in test_megatron_cpu_train.py). What runs here
is everything between the HF weights and a head's output:
:func:`~roll.workers.megatron_train.transformer_config`, :func:`~roll.workers.megatron_train.build_gpt_model`
(with the value/score head swapped in), :func:`~roll.workers.megatron_train.load_stage_weights` (the TP shards of
:mod:`roll.workers.megatron_convert`, strict), left alignment, and the readers: values, scores, vocabulary-parallel
log-probs and entropy (all-reduced over the TP group), and the full-vocabulary logits a student reads.

Measured (TP 1 and 2, max abs difference to HF): values 6e-8, scores 3e-8, log-probs 5e-7, entropy 1e-6,
logits 1.5e-7; the tolerance is 1e-5.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.megatron


def heads_run(tp: int) -> dict[str, float]:
    """In each of ``tp`` processes: the max difference of every head's output to its HF model's."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from roll.workers.megatron_device import CudaToCpu, install_cpu_patches

    dist.init_process_group("gloo")
    parallel_state.initialize_model_parallel(tp, 1)
    install_cpu_patches()
    with CudaToCpu():
        return _heads_diffs(tp)


def _heads_diffs(tp: int) -> dict[str, float]:
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    from roll.workers import megatron_heads as mh
    from roll.workers.logprobs import forward_scores
    from roll.workers.roles.heads import score_forward, value_forward

    cfg = Qwen2Config(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_labels=1, max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=0,
    )  # fmt: skip
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    ids = torch.randint(1, 100, (3, 6), generator=torch.Generator().manual_seed(1)) * mask
    predicted = torch.zeros_like(mask, dtype=torch.bool)
    predicted[:, 1:] = mask[:, :-1].bool() & mask[:, 1:].bool()
    torch.manual_seed(0)
    value_hf = AutoModelForTokenClassification.from_config(cfg).eval()
    with torch.no_grad():
        value_hf.score.bias.fill_(0.3)  # a bias that is not 0, so a dropped one shows
        values = mh.read_values(_stage(cfg, value_hf, "value", tp, ids, mask), 1.0, False).values_BT
        score_hf = AutoModelForSequenceClassification.from_config(cfg).eval()
        scores = mh.read_scores(_stage(cfg, score_hf, "score", tp, ids, mask), 1.0, False).scores_B
        lm = Qwen2ForCausalLM(cfg).eval()
        stage = _stage(cfg, lm, "lm", tp, ids, mask)
        lp = mh.read_logprobs(stage, 0.7, True)
        ref_lp, ref_ent = forward_scores(lm, ids, mask, temperature=0.7, with_entropy=True)
        hf_logits = lm(input_ids=ids, attention_mask=mask).logits
        logits_BTV = mh.token_logits(stage)
    assert values is not None and scores is not None and lp.entropy_BT is not None and ref_ent is not None
    return {
        "values": float((values - value_forward(value_hf, ids, mask, False, 1.0).values_BT).abs().max()),
        "scores": float((scores - score_forward(score_hf, ids, mask, False, 1.0).scores_B).abs().max()),
        "logp": float((lp.logp_BT - ref_lp).abs().max()),
        "entropy": float(((lp.entropy_BT - ref_ent) * predicted).abs().max()),
        "logits": float(
            (logits_BTV[:, 1:][predicted[:, 1:]] - hf_logits[:, :-1][predicted[:, 1:]]).abs().max()
        ),
    }


def _stage(cfg: Any, hf: torch.nn.Module, head: str, tp: int, ids: torch.Tensor, mask: torch.Tensor) -> Any:
    """The last (only) stage's output for ``ids``, from a GPTModel built and loaded as the strategy does."""
    from roll.workers import megatron_train as mt
    from roll.workers.megatron_config import MegatronConfig
    from roll.workers.megatron_convert import GPTLayout
    from roll.workers.megatron_heads import StageOutput, align_left

    config = MegatronConfig(precision="fp32", tensor_parallel_size=tp)
    layout = GPTLayout.from_hf_config(cfg, head=head, tp_size=tp)  # type: ignore[arg-type]
    tconfig = mt.transformer_config(cfg, layout, config)
    tconfig.use_cpu_initialization = True
    model = mt.build_gpt_model(cfg, layout, config, tconfig, torch.device("cpu"))
    mt.load_stage_weights(model, {k: v.detach() for k, v in hf.state_dict().items()}, layout)
    aligned = align_left(ids, mask)
    output = model(aligned.ids_BT, torch.arange(ids.shape[1]).expand_as(ids), None)
    return StageOutput(output, aligned, cfg.vocab_size)


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_heads_on_cpu_equal_the_hf_models(tp: int, tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "gpu"))  # tests/gpu/tp_launch.py (found by path)
    import tp_launch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    diffs = tp_launch.launch(tp, tmp_path, Path(__file__), "heads_run")
    assert set(diffs) == {"values", "scores", "logp", "entropy", "logits"}
    for name, diff in diffs.items():
        assert diff < 1e-5, (name, diff)
