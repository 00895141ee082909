"""HFInferStrategy: our decode loop against ``model.generate``, and its log-probs against ``compute_logprobs``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from roll.core.errors import DataError, WorkerError
from roll.workers.config import HFInferConfig, SamplingParams
from roll.workers.hf_infer import HFInferStrategy, length_chunks
from roll.workers.specs import HF
from roll.workers.types import GeneratedSample, InferStrategy

PROMPTS = [[5, 17, 3, 99, 42, 7, 8], [11, 2], [64, 65, 66, 67]]


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
        pad_token_id=0,
    )
    cfg.eos_token_id = None
    model = Qwen2ForCausalLM(cfg)
    torch.nn.Module.eval(model)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


class CharTokenizer:
    """Token ``i`` decodes to one letter, so stop strings are predictable."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)

    def batch_decode(self, rows: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(r) for r in rows]


@pytest.fixture(scope="module")
def strategy() -> HFInferStrategy:
    return HFInferStrategy(tiny_model(), HFInferConfig(device="cpu"), tokenizer=CharTokenizer())


def hf_greedy(model: Any, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    T = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (T - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False)
    result: list[list[int]] = out[:, T:].tolist()
    return result


def as_sequences(prompts: list[list[int]], samples: list[GeneratedSample]) -> tuple[torch.Tensor, ...]:
    """Left-padded prompt + right-padded response, with the response mask, as compute_logprobs takes them."""
    P = max(len(p) for p in prompts)
    R = max(len(s.token_ids) for s in samples)
    ids, mask, resp = [], [], []
    for s in samples:
        p, r = prompts[s.prompt_index], s.token_ids
        ids.append([0] * (P - len(p)) + p + r + [0] * (R - len(r)))
        mask.append([0] * (P - len(p)) + [1] * (len(p) + len(r)) + [0] * (R - len(r)))
        resp.append([0] * P + [1] * len(r) + [0] * (R - len(r)))
    return torch.tensor(ids), torch.tensor(mask), torch.tensor(resp)


def test_satisfies_protocol_and_spec(strategy: HFInferStrategy) -> None:
    assert isinstance(strategy, InferStrategy)
    assert HF.kind == "infer" and HF.config_model is HFInferConfig


def test_greedy_equals_model_generate(strategy: HFInferStrategy) -> None:
    samples = strategy.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=12))
    expected = hf_greedy(strategy.model, PROMPTS, 12)
    assert [s.token_ids for s in samples] == expected
    assert all(s.finish_reason == "length" and len(s.logprobs) == 12 for s in samples)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_generation_logprobs_equal_compute_logprobs(strategy: HFInferStrategy, temperature: float) -> None:
    params = SamplingParams(n=2, temperature=temperature, top_k=20, top_p=0.9, max_new_tokens=10, seed=3)
    samples = strategy.generate(PROMPTS, params)
    ids, mask, resp = as_sequences(PROMPTS, samples)
    scores = strategy.compute_logprobs(ids, mask, response_mask=resp, temperature=temperature or 1.0)
    for row, s in enumerate(samples):
        got = scores.logp_BT[row][resp[row].bool()]
        torch.testing.assert_close(got, torch.tensor(s.logprobs), atol=1e-5, rtol=0)


def test_left_padding_does_not_change_results(strategy: HFInferStrategy) -> None:
    params = SamplingParams(temperature=0, max_new_tokens=10)
    alone = strategy.generate([PROMPTS[1]], params)[0]
    batched = strategy.generate([PROMPTS[0], PROMPTS[1]], params)[1]
    assert alone.token_ids == batched.token_ids
    torch.testing.assert_close(
        torch.tensor(alone.logprobs), torch.tensor(batched.logprobs), atol=1e-5, rtol=0
    )


def test_stop_token_and_stop_string_end_a_sample(strategy: HFInferStrategy) -> None:
    free = strategy.generate([PROMPTS[0]], SamplingParams(temperature=0, max_new_tokens=12))[0]
    stop_tok = free.token_ids[4]
    first = free.token_ids.index(stop_tok)
    by_token = strategy.generate(
        [PROMPTS[0]], SamplingParams(temperature=0, max_new_tokens=12, stop_token_ids=[stop_tok])
    )
    assert by_token[0].token_ids == free.token_ids[: first + 1] and by_token[0].finish_reason == "stop"
    text = CharTokenizer().decode(free.token_ids)
    stop_str = text[5:7]
    by_string = strategy.generate(
        [PROMPTS[0]], SamplingParams(temperature=0, max_new_tokens=12, stop_strings=[stop_str])
    )
    end = text.index(stop_str)
    assert by_string[0].finish_reason == "stop"
    assert by_string[0].text == text[:end]
    assert by_string[0].token_ids == free.token_ids[: end + 2]


def test_n_per_prompt_and_seeds_are_reproducible(strategy: HFInferStrategy) -> None:
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=8, seed=7)
    a, b = strategy.generate(PROMPTS, params), strategy.generate(PROMPTS, params)
    assert [(s.prompt_index, s.sample_index) for s in a] == [(p, i) for p in range(3) for i in range(3)]
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    other = strategy.generate(PROMPTS, params.model_copy(update={"seed": 8}))
    assert [s.token_ids for s in a] != [s.token_ids for s in other]
    assert len({tuple(s.token_ids) for s in a[:3]}) > 1  # the n samples of a prompt differ


def test_a_seeded_prompt_samples_the_same_alone_batched_chunked_and_after_other_calls() -> None:
    """Prompt seed 1234 fixes prompt ``[11, 2]``'s 3 samples: alone; third among others of other lengths (other
    left padding); in a chunk of 3 sequences (``generation_batch_size=3``, one prompt per chunk); after unrelated
    unseeded calls. Seed 1235 changes them. Temperature 1.5 over 128 tokens: two runs of 3 x 8 tokens agree by
    chance with probability far below 1e-9."""
    strategy = HFInferStrategy(tiny_model(), HFInferConfig(device="cpu"))
    chunked = HFInferStrategy(tiny_model(), HFInferConfig(device="cpu", generation_batch_size=3))
    params = SamplingParams(n=3, temperature=1.5, max_new_tokens=8)
    alone = [s.token_ids for s in strategy.generate([[11, 2]], params, seeds=[1234])]
    others = [[5, 17, 3, 99, 42, 7, 8], [64, 65, 66, 67]]
    strategy.generate(others, params)  # unseeded: advances torch's global RNG, and the model's cache state
    batched = strategy.generate([*others, [11, 2]], params, seeds=[1, 2, 1234])
    assert [s.token_ids for s in batched[6:]] == alone
    split = chunked.generate([[64, 65], [11, 2]], params, seeds=[9, 1234])
    assert [s.token_ids for s in split[3:]] == alone
    assert len({tuple(t) for t in alone}) > 1  # the 3 samples differ from each other
    assert [s.token_ids for s in strategy.generate([[11, 2]], params, seeds=[1235])] != alone


def test_seeds_must_match_the_prompts(strategy: HFInferStrategy) -> None:
    with pytest.raises(DataError, match="2 seeds for 3 prompts"):
        strategy.generate(PROMPTS, SamplingParams(), seeds=[1, 2])


def test_top_k_one_and_tiny_top_p_equal_greedy(strategy: HFInferStrategy) -> None:
    greedy = strategy.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=8))
    top_k = strategy.generate(PROMPTS, SamplingParams(temperature=1.3, top_k=1, max_new_tokens=8, seed=1))
    top_p = strategy.generate(PROMPTS, SamplingParams(temperature=1.3, top_p=1e-6, max_new_tokens=8, seed=1))
    assert [s.token_ids for s in top_k] == [s.token_ids for s in greedy] == [s.token_ids for s in top_p]


def test_finished_rows_leave_the_batch_without_changing_others(strategy: HFInferStrategy) -> None:
    """One stop token ends some rows early; the survivors still decode exactly as in the free run."""
    free = strategy.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=10))
    stop_tok = free[1].token_ids[2]
    stopped = strategy.generate(
        PROMPTS, SamplingParams(temperature=0, max_new_tokens=10, stop_token_ids=[stop_tok])
    )
    for f, s in zip(free, stopped):
        cut = f.token_ids.index(stop_tok) + 1 if stop_tok in f.token_ids else len(f.token_ids)
        assert s.token_ids == f.token_ids[:cut]


def test_length_chunked_greedy_decoding_equals_the_plain_forward() -> None:
    """Three prompts of lengths 7, 2, 4 in chunks of two (``generation_batch_size=2``): by length, [1, 2] then [0],
    so rows are left-padded within a chunk and come back in prompt order. Each sample's greedy tokens are the
    argmax of one plain forward over its own prompt + generated tokens (no cache, no padding; the logits at
    position ``t - 1`` predict token ``t``), and its log-probs that forward's ``log_softmax`` at those tokens, equal
    to 1e-5 (only the summation order of the cached, padded path differs)."""
    strategy = HFInferStrategy(tiny_model(), HFInferConfig(device="cpu", generation_batch_size=2))
    samples = strategy.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=8))
    assert [s.prompt_index for s in samples] == [0, 1, 2]
    for p, s in zip(PROMPTS, samples):
        ids_1T = torch.tensor([p + s.token_ids])
        with torch.no_grad():
            logits_RV = strategy.model(input_ids=ids_1T).logits[0, len(p) - 1 : -1]
        assert logits_RV.argmax(-1).tolist() == s.token_ids
        logp_R = logits_RV.log_softmax(-1).gather(-1, ids_1T[0, len(p) :, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(s.logprobs), logp_R, atol=1e-5, rtol=0)


def test_prompts_chunk_by_length_and_come_back_in_order() -> None:
    """Lengths [5, 2, 9, 2] in chunks of 2 go as [1, 3] (both 2 long) then [0, 2]; one chunk keeps the order.
    Seeded sampling with chunks of one prompt (``generation_batch_size=2``, ``n=2``) equals the unchunked call,
    ordered by (prompt, sample)."""
    assert length_chunks([5, 2, 9, 2], 2) == [[1, 3], [0, 2]]
    assert length_chunks([5, 2, 9, 2], 4) == [[0, 1, 2, 3]]
    prompts = [[5, 17, 3, 99, 42], [11, 2], [64, 65, 66, 67, 68, 69, 70, 71, 72], [9, 9]]
    params = SamplingParams(n=2, temperature=1.5, max_new_tokens=6)
    whole = HFInferStrategy(tiny_model(), HFInferConfig(device="cpu")).generate(
        prompts, params, seeds=[1, 2, 3, 4]
    )
    chunked = HFInferStrategy(tiny_model(), HFInferConfig(device="cpu", generation_batch_size=2))
    split = chunked.generate(prompts, params, seeds=[1, 2, 3, 4])
    assert [(s.prompt_index, s.sample_index) for s in split] == [(p, i) for p in range(4) for i in range(2)]
    assert [s.token_ids for s in split] == [s.token_ids for s in whole]


def test_load_weights_versions_and_rejects_unknown_names() -> None:
    strategy = HFInferStrategy(tiny_model(0), HFInferConfig(device="cpu"))
    before = strategy.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=6))
    strategy.load_weights(dict(tiny_model(1).state_dict()), policy_version=3)
    after = strategy.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=6))
    assert strategy.policy_version == 3 and all(s.policy_version == 3 for s in after)
    assert [s.token_ids for s in before] != [s.token_ids for s in after]
    with pytest.raises(WorkerError, match="unknown"):
        strategy.load_weights({"no.such.weight": torch.zeros(1)}, policy_version=4)
    strategy.offload()
    strategy.reload()


def test_stop_strings_need_a_tokenizer() -> None:
    strategy = HFInferStrategy(tiny_model(), HFInferConfig(device="cpu"))
    with pytest.raises(DataError, match="tokenizer"):
        strategy.generate(PROMPTS, SamplingParams(stop_strings=["x"]))
