"""Partial rollout on the hf strategy: segments of a sample, continued from their prefix, before and after a weight
update (:mod:`roll.workers.roles.partial` over :meth:`HFInferStrategy.continue_samples`)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.errors import DataError
from roll.workers.config import HFInferConfig, SamplingParams
from roll.workers.hf_infer import HFInferStrategy
from roll.workers.roles.partial import generate_segment
from roll.workers.types import ContinuesSamples

PROMPTS = [[5, 17, 3, 99, 42, 7, 8], [11, 2], [64, 65, 66, 67]]
SEEDS = [101, 202, 303]
PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=12)


def tiny_model(seed: int) -> Qwen2ForCausalLM:
    """A random 2-layer Qwen2 that never stops (no EOS), so every sample runs to ``max_new_tokens``."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=256, pad_token_id=0,
    )  # fmt: skip
    cfg.eos_token_id = None
    model = Qwen2ForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def strategy(seed: int = 0) -> HFInferStrategy:
    return HFInferStrategy(tiny_model(seed), HFInferConfig(device="cpu"))


def first_request(segment: int) -> Batch:
    return Batch(
        {C.SEGMENT_TOKENS: torch.full((len(PROMPTS),), segment), C.PROMPT_INDEX: torch.arange(len(PROMPTS))},
        {C.PROMPT_IDS: [list(p) for p in PROMPTS]},
    )


def to_continue(rows: Batch, segment: int) -> Batch:
    """What the scheduler sends back: the unfinished rows, their tokens as the prefix."""
    keep = [i for i, r in enumerate(rows[C.FINISH_REASON]) if r == "abort"]
    sub = rows.select(keep)
    non_tensors = {
        k: v for k, v in sub.non_tensors.items() if k not in (C.RESPONSE_IDS, C.FINISH_REASON, C.TEXT)
    }
    non_tensors[C.RESPONSE_PREFIX_IDS] = list(sub.non_tensors[C.RESPONSE_IDS])
    tensors = {k: v for k, v in sub.tensors.items() if k != C.POLICY_VERSION}
    tensors[C.SEGMENT_TOKENS] = torch.full((len(sub),), segment)
    return Batch(tensors, non_tensors)


def run_segments(model: HFInferStrategy, segment: int, between: object = None) -> tuple[Batch, int]:
    """Segment after segment until every sample is done; ``between(k)`` runs after segment ``k``. Returns the
    finished rows (by prompt, sample) and the number of segments."""
    rows = generate_segment(model, first_request(segment), PARAMS, SEEDS, "test")
    done, k = [], 1
    while True:
        done += [rows.select([i]) for i, r in enumerate(rows[C.FINISH_REASON]) if r != "abort"]
        if all(r != "abort" for r in rows[C.FINISH_REASON]):
            break
        if callable(between):
            between(k)
        again = to_continue(rows, segment)
        rows = generate_segment(model, again, PARAMS, list(map(int, again[C.PROMPT_SEED])), "test")
        k += 1
    out = Batch.concat(done)
    order = sorted(range(len(out)), key=lambda i: (int(out[C.PROMPT_INDEX][i]), int(out[C.SAMPLE_INDEX][i])))
    return out.select(order), k


def lists(column: object) -> list[list[int]]:
    return [[int(t) for t in row] for row in column]  # type: ignore[attr-defined]


def test_hf_continues_samples() -> None:
    assert isinstance(strategy(), ContinuesSamples)


def test_segments_under_unchanged_weights_equal_the_whole_sample() -> None:
    """Uniform ``t`` of a sample's own stream draws its ``t``-th token in whatever segment it falls, so with
    unchanged weights 12 tokens in segments of 5 (5 + 5 + 2, each continuation a fresh prefill of prompt + prefix)
    are the 12 tokens of one uninterrupted call, with the same log-probs (to float order)."""
    model = strategy()
    whole = model.generate(PROMPTS, PARAMS, SEEDS)
    rows, segments = run_segments(model, 5)
    assert segments == 3
    assert lists(rows[C.RESPONSE_IDS]) == [s.token_ids for s in whole]
    for got, want in zip(rows[C.RESPONSE_LOGP], whole):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want.logprobs), atol=1e-5, rtol=1e-5)
    assert list(rows[C.FINISH_REASON]) == ["length"] * len(
        whole
    )  # max_new_tokens, never "abort", once finished


def test_a_weight_update_between_segments_switches_versions_and_records_sampling_logprobs() -> None:
    """Segment 1 (4 tokens) on model A as version 0; then model B's weights load as version 1 and the samples
    continue from their prefix. Each token records the version that sampled it ([0] * 4 + [1] * 8); the prefix is
    model A's own first 4 tokens; every recorded log-prob is the sampler's at that token: model A's for the
    prefix and model B's (given the whole prefix) for the rest, which is what the trainer's importance ratios
    and the mismatch metrics read."""
    model, model_b = strategy(0), tiny_model(1)
    whole_a = model.generate(PROMPTS, PARAMS, SEEDS)

    def update(k: int) -> None:
        if k == 1:
            model.load_weights(dict(model_b.state_dict()), policy_version=1)

    rows, _ = run_segments(model, 4, update)
    prompts = [PROMPTS[int(p)] for p in rows[C.PROMPT_INDEX]]
    assert lists(rows[C.RESPONSE_POLICY_VERSION]) == [[0] * 4 + [1] * 8] * len(rows)
    assert rows[C.POLICY_VERSION].tolist() == [0] * len(rows)
    assert [r[:4] for r in lists(rows[C.RESPONSE_IDS])] == [s.token_ids[:4] for s in whole_a]
    assert lists(rows[C.RESPONSE_IDS]) != [s.token_ids for s in whole_a], (
        "B sampled exactly as A: no update seen"
    )
    ids = [list(p) + list(r) for p, r in zip(prompts, rows[C.RESPONSE_IDS])]
    T = max(map(len, ids))
    ids_BT = torch.tensor([row + [0] * (T - len(row)) for row in ids])
    mask_BT = torch.tensor([[1] * len(row) + [0] * (T - len(row)) for row in ids])
    logp_b = model.compute_logprobs(ids_BT, mask_BT).logp_BT  # model B is served now
    a = strategy(0)
    logp_a = a.compute_logprobs(ids_BT, mask_BT).logp_BT
    for b, (p, got) in enumerate(zip(prompts, rows[C.RESPONSE_LOGP])):
        P = len(p)
        torch.testing.assert_close(torch.tensor(got[:4]), logp_a[b, P : P + 4], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.tensor(got[4:]), logp_b[b, P + 4 : P + 12], atol=1e-5, rtol=1e-5)


def test_partial_rollout_needs_seeds() -> None:
    with pytest.raises(DataError, match="seeded"):
        generate_segment(strategy(), first_request(4), PARAMS, None, "test")
