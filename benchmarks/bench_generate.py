"""Benchmark: ``HFInferStrategy.generate`` against plain ``model.generate`` on the same work.

Both sides decode the same left-padded prompts (batch 64, lengths 8..24) with the same random-init Qwen2 (about
1M and 10M parameters), the same thread count, ``torch.set_flush_denormal(True)`` and fixed seeds. No EOS is set,
so in the ``greedy`` and ``sample`` modes every sample runs ``max_new_tokens`` and both sides produce exactly the
same number of tokens. The ``sample+eos`` mode makes 1/32 of the vocabulary's ids stop tokens on both sides, so
samples end at varied lengths as RL responses do; there tokens/s counts each sample's tokens up to and including
its stop token (``model.generate`` keeps computing finished rows as padding; our loop drops them). Each cell is
the best of ``--repeats`` runs after one warm-up.

Usage: ``uv run python benchmarks/bench_generate.py [--threads 2] [--repeats 3] [--quick]``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from roll.workers.config import HFInferConfig, SamplingParams
from roll.workers.hf_infer import HFInferStrategy

SIZES: dict[str, dict[str, Any]] = {
    "1M": {"vocab_size": 512, "hidden_size": 128, "num_hidden_layers": 4, "intermediate_size": 384},
    "10M": {"vocab_size": 2048, "hidden_size": 256, "num_hidden_layers": 8, "intermediate_size": 1024},
}


@dataclass(frozen=True)
class Case:
    size: str
    max_new_tokens: int
    mode: str  # "greedy", "sample" or "sample+eos"

    def stop_ids(self, vocab: int) -> list[int]:
        """1/32 of the vocabulary stops a sample: about 3% per step, a mean length near 30 tokens."""
        return list(range(1, 1 + vocab // 32)) if self.mode == "sample+eos" else []


def build_model(size: str) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        **SIZES[size],
    )
    cfg.eos_token_id = None
    model = Qwen2ForCausalLM(cfg)
    torch.nn.Module.eval(model)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def make_prompts(vocab: int, batch: int = 64) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, 25, (batch,), generator=g).tolist()
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


def run_hf(model: Qwen2ForCausalLM, prompts: list[list[int]], case: Case) -> int:
    T = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (T - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts])
    stop_ids = case.stop_ids(model.config.vocab_size)
    kwargs: dict[str, object] = {"do_sample": False, "min_new_tokens": case.max_new_tokens}
    if case.mode != "greedy":
        kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
        kwargs["eos_token_id"] = stop_ids or None
        kwargs["min_new_tokens"] = 0 if stop_ids else case.max_new_tokens
    torch.manual_seed(0)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=case.max_new_tokens, **kwargs)
    return sum(_length_until_stop(row, stop_ids) for row in out[:, T:].tolist())


def _length_until_stop(tokens: list[int], stop_ids: list[int]) -> int:
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return i + 1
    return len(tokens)


def run_ours(strategy: HFInferStrategy, prompts: list[list[int]], case: Case) -> int:
    vocab: int = cast(Any, strategy.model).config.vocab_size
    temperature = 0.0 if case.mode == "greedy" else 1.0
    params = SamplingParams(
        temperature=temperature,
        max_new_tokens=case.max_new_tokens,
        stop_token_ids=case.stop_ids(vocab),
        seed=0,
    )
    return sum(len(s.token_ids) for s in strategy.generate(prompts, params))


def best_rate(fn: Callable[[], int], repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    tokens = 0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = fn()
        best = min(best, time.perf_counter() - start)
    return tokens / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1M model, 32 tokens only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    cases = [Case(s, n, m) for s in SIZES for n in (32, 64) for m in ("greedy", "sample", "sample+eos")]
    if args.quick:
        cases = [c for c in cases if c.size == "1M" and c.max_new_tokens == 32]
    print(f"threads={args.threads} batch=64 repeats={args.repeats} torch={torch.__version__}")
    print(f"{'model':>6} {'new':>4} {'mode':>10} {'hf tok/s':>10} {'roll tok/s':>11} {'ratio':>6}")
    models: dict[str, Qwen2ForCausalLM] = {}
    for case in cases:
        model = models.setdefault(case.size, build_model(case.size))
        prompts = make_prompts(model.config.vocab_size)
        strategy = HFInferStrategy(model, HFInferConfig(device="cpu", dtype="float32"))
        hf = best_rate(lambda: run_hf(model, prompts, case), args.repeats)  # noqa: B023
        ours = best_rate(lambda: run_ours(strategy, prompts, case), args.repeats)  # noqa: B023
        print(
            f"{case.size:>6} {case.max_new_tokens:>4} {case.mode:>10} {hf:>10.0f} {ours:>11.0f} {ours / hf:>6.2f}"
        )


if __name__ == "__main__":
    main()
