"""Decode rate of the generation-heavy shape against this box's limit: roll's ``hf`` generator vs ``model.generate``.

The work of one ``bench_gen_heavy_vs_trl.py`` step's generation: the same 30.4M Qwen2 shape (hidden 512, 10 layers,
8 heads / 2 KV heads, MLP 1536, 512-token vocabulary; random init, seed 0, no stop token so every row runs the
limit), ``--P`` = 16 prompts of 18 tokens x ``--G`` = 8 samples = 128 rows decoded together, 128 new tokens each,
temperature 1. Sides, alternating each round (the box is shared, so A and B see the same neighbours):

- ``roll fp32`` / ``roll bf16``: :class:`~roll.workers.hf_infer.HFInferStrategy` with ``dtype`` float32 / bfloat16
  (``actor_infer.strategy.dtype``), one ``generate`` call with ``n = G``; on CPU it decodes with
  :mod:`roll.workers.decode_attention`;
- ``roll fp32 sdpa``: the same with transformers' ``sdpa`` kept (the decode loop before that module);
- ``hf fp32`` / ``hf bf16-autocast`` / ``hf bf16``: ``model.generate`` on the ``P x G`` rows (TRL's generator: it
  repeats each prompt ``G`` times and samples), in float32, under ``torch.autocast("cpu", bfloat16)`` (what TRL's
  ``bf16=True`` gives ``generate`` on a CPU), and on a bfloat16 copy of the weights.

Columns: median tokens/s over the rounds, its fraction of the box limit (``2 * N`` FLOP per token, ``N`` the decoder
linears plus the output head, against the fp32 matmul peak of :func:`bench_mfu.matmul_peak_flops` measured before
and after, the higher taken), tokens per CPU-second of this process divided by the thread count (what the rate
would be with the threads' cores to itself: a steadier figure on a loud box, never quoted as wall time), and the
1-minute load average at each of the side's runs. Quote wall ratios only with load under 1.5 on 2 cores.

Run: ``uv run python benchmarks/bench_decode.py [--rounds 3] [--sides roll-fp32,roll-bf16,hf-fp32]``
(about 2 min on a quiet box with the default sides).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts its OpenMP pool

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
import bench_mfu  # the matmul peak and N

from roll.workers.config import HFInferConfig, SamplingParams
from roll.workers.hf_infer import HFInferStrategy

SIDES = ("roll-fp32", "roll-bf16", "roll-fp32-sdpa", "hf-fp32", "hf-bf16-autocast", "hf-bf16")


def build_model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=512, hidden_size=512, num_hidden_layers=10, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=1536, max_position_embeddings=1024, pad_token_id=0, tie_word_embeddings=True,
    )  # fmt: skip
    cfg.eos_token_id = None
    model = Qwen2ForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def roll_side(model: Qwen2ForCausalLM, dtype: str, sdpa: bool, args: argparse.Namespace) -> Callable[[], int]:
    strategy = HFInferStrategy(copy.deepcopy(model), HFInferConfig(device="cpu", dtype=dtype))
    if sdpa:
        strategy.model.set_attn_implementation("sdpa")
    prompts = [[5 + p] * args.prompt_len for p in range(args.P)]
    params = SamplingParams(temperature=1.0, n=args.G, max_new_tokens=args.max_new_tokens, seed=0)
    return lambda: sum(len(s.token_ids) for s in strategy.generate(prompts, params))


def hf_side(model: Qwen2ForCausalLM, autocast: bool, args: argparse.Namespace) -> Callable[[], int]:
    ids = torch.tensor([[5 + p] * args.prompt_len for p in range(args.P)]).repeat_interleave(args.G, 0)

    def run() -> int:
        torch.manual_seed(0)
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                min_new_tokens=args.max_new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            )  # fmt: skip
        return int(out[:, ids.shape[1] :].numel())

    return run


def make_side(name: str, model: Qwen2ForCausalLM, args: argparse.Namespace) -> Callable[[], int]:
    if name.startswith("roll"):
        return roll_side(model, "bfloat16" if "bf16" in name else "float32", name.endswith("sdpa"), args)
    if name == "hf-bf16":
        return hf_side(copy.deepcopy(model).to(torch.bfloat16), False, args)
    return hf_side(model, "autocast" in name, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sides", default="roll-fp32,roll-bf16,hf-fp32", help=f"comma-separated of {SIDES}")
    parser.add_argument("--P", type=int, default=16)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=18)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    names = args.sides.split(",")
    unknown = sorted(set(names) - set(SIDES))
    if unknown:
        raise SystemExit(f"unknown sides {unknown}; choose from {SIDES}")
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    print(
        f"load average at start: {os.getloadavg()}, cores: {os.cpu_count()}, threads: {args.threads}",
        flush=True,
    )
    peaks = [bench_mfu.matmul_peak_flops(args.threads, 20)]
    model = build_model()
    n_matmul = sum(bench_mfu.matmul_params(model))
    sides = {name: make_side(name, model, args) for name in names}
    for run in sides.values():
        run()  # warm-up: kernels, pages, the first call's allocations
    rates: dict[str, list[float]] = {n: [] for n in names}
    cpu_rates: dict[str, list[float]] = {n: [] for n in names}
    loads: dict[str, list[float]] = {n: [] for n in names}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            tokens = sides[name]()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            rates[name].append(tokens / wall)
            cpu_rates[name].append(tokens * args.threads / cpu)
            loads[name].append(os.getloadavg()[0])
            print(
                f"round {round_} {name}: {tokens / wall:.0f} tokens/s, load {loads[name][-1]:.2f}", flush=True
            )
    peaks.append(bench_mfu.matmul_peak_flops(args.threads, 20))
    limit = max(peaks) / (2 * n_matmul)
    print(
        f"{args.P}x{args.G} rows x {args.max_new_tokens} new tokens; N = {n_matmul / 1e6:.1f}M matmul weights; fp32"
        f" matmul peak (before, after) {', '.join(f'{p / 1e9:.1f}' for p in peaks)} GFLOP/s -> box limit"
        f" {limit:.0f} tokens/s"
    )
    base = statistics.median(rates[names[-1]])
    print(f"{'side':<18} {'tokens/s':>9} {'/limit':>7} {'/' + names[-1]:>18} {'tok/CPU-s':>10}  load")
    for name in names:
        rate = statistics.median(rates[name])
        cpu_rate = statistics.median(cpu_rates[name])
        load = " ".join(f"{x:.2f}" for x in loads[name])
        print(f"{name:<18} {rate:>9.0f} {rate / limit:>7.2f} {rate / base:>18.2f} {cpu_rate:>10.0f}  {load}")


if __name__ == "__main__":
    main()
