"""Training MFU on CPU: roll's SFT step as a fraction of this machine's measured fp32 matmul peak, in one run.

The peak: the best of ``--peak-reps`` timed ``[2048, 2048] @ [2048, 2048]`` fp32 matmuls on ``--threads`` torch
threads, ``2 * 2048**3`` FLOPs each (a quiet 2-core box of this kind gives ~140 GFLOP/s). The step: our
``FSDP2TrainStrategy.train_step`` with ``SFTLoss`` on the built-in arithmetic SFT rows, the batches and sizes of
``bench_sft_dpo_vs_trl.py`` (64 rows per step, micro-batches of 32, AdamW, fp32, tiny-1m), timed per step.

FLOPs of a step, stated (the usual "model FLOPs" of PaLM's MFU, not what the kernels happen to execute):
``6 * N * tokens``, where ``tokens`` are the step's real (non-padding) tokens and ``N`` the weights that multiply
every token: each decoder layer's linear layers plus the output projection (``V * H``, counted even though tied to
the embedding, whose lookup is no matmul); norms, biases, RoPE and attention's ``QK^T``/``AV`` are left out
(``12 * L * H * T`` per token, ~2% here at ``T`` ~ 40). ``6 = 2`` (forward multiply-add) ``+ 4`` (backward: input
and weight gradients). Our step runs the output projection only at the positions the loss reads (the answer
tokens), so it executes fewer FLOPs than the formula credits; the ``needed`` column counts the head only there,
the work any implementation must do, and its fraction of the peak is the stricter figure.

Rows: each configuration of our step (``padded`` micro-batches of 32 or one of 64, ``packed`` padding-free ones)
with its median step time, tokens/s, GFLOP/s and fraction of the peak, and the 1-minute load average seen
while it ran. On a shared box the peak and the step are measured back to back, so both see about the same load;
quote a fraction only with the load beside it.

Run: ``uv run python benchmarks/bench_mfu.py [--steps 20 --threads 2]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import bench_sft_dpo_vs_trl as sft_bench  # the rows, sizes and strategy of the SFT benchmark

PEAK_N = 2048


def matmul_peak_flops(threads: int, reps: int) -> float:
    """Best-of-``reps`` FLOP/s of one ``[n, n] @ [n, n]`` fp32 matmul (``2 n^3`` FLOPs), ``n`` = 2048."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(PEAK_N, PEAK_N), torch.randn(PEAK_N, PEAK_N)
    out = torch.empty(PEAK_N, PEAK_N)
    torch.mm(a, b, out=out)  # warm the kernel and the pages
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    return 2 * PEAK_N**3 / best


def matmul_params(model: Any) -> tuple[int, int]:
    """``(N_body, N_head)``: weights of the decoder's linear layers, and of the output projection ``V * H``."""
    import torch

    head = model.get_output_embeddings()
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    return body, head.weight.numel()


def time_steps(packed: bool, micro: int, steps: int, warmup: int) -> dict[str, Any]:
    """Median step seconds, and per-step real tokens and loss-read tokens, of our SFT step in one config."""
    from roll.core import columns as C
    from roll.pipelines.common.data import sft_batch
    from roll.pipelines.sft.losses import SFTLoss

    os.environ[sft_bench.BEST_ENV] = "1" if packed else "0"
    sft_bench.MICRO_SEQS = micro
    rows, tokenizer = sft_bench._rows("sft")
    strategy, loss_fn = sft_bench._our_strategy(), SFTLoss()
    batches = sft_bench._batches(rows, sft_bench.BATCH_SEQS)
    times, tokens, scored, loads = [], [], [], []
    for i in range(warmup + steps):
        batch = sft_batch(batches[i % len(batches)], pad_id=tokenizer.pad_token_id)
        mb = sft_bench._as_micro_batch(batch)
        start = time.perf_counter()
        strategy.train_step(mb, loss_fn)
        if i >= warmup:
            times.append(time.perf_counter() - start)
            tokens.append(float(mb["attention_mask"].sum()))
            scored.append(float((batch.tensors[C.LABELS] != -100).sum()))
            loads.append(os.getloadavg()[0])
    return {
        "model": strategy.model,
        "step_s": statistics.median(times),
        "tokens": statistics.median(tokens),
        "scored": statistics.median(scored),
        "load": (min(loads), max(loads)),
    }


CONFIGS = [("padded, micro 32", False, 32), ("padded, micro 64", False, 64), ("packed, micro 32", True, 32)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peak-reps", type=int, default=20)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when OpenMP starts: set before torch runs
    sft_bench._setup(args.threads)
    peaks = [(matmul_peak_flops(args.threads, args.peak_reps), os.getloadavg()[0])]
    results = [(name, time_steps(packed, micro, args.steps, args.warmup)) for name, packed, micro in CONFIGS]
    # measured before and after the steps, the higher taken: another process on a core halves a 2-thread matmul,
    # and a peak measured low would inflate every fraction below
    peaks.append((matmul_peak_flops(args.threads, args.peak_reps), os.getloadavg()[0]))
    peak = max(p for p, _ in peaks)
    seen = ", ".join(f"{p / 1e9:.1f} (load {load:.1f})" for p, load in peaks)
    print(f"fp32 matmul peak ({PEAK_N}^2, {args.threads} threads), before and after: {seen} GFLOP/s")
    print(
        f"{'roll sft step':<20} {'s/step':>7} {'tok/step':>8} {'tokens/s':>8} {'GFLOP/s':>8} {'MFU':>6} "
        f"{'needed':>7} load"
    )
    for name, r in results:
        body, head = matmul_params(r["model"])
        flops = 6 * (body + head) * r["tokens"]  # the formula: 6 * N * tokens
        needed = 6 * (body * r["tokens"] + head * r["scored"])  # the head only where the loss reads it
        rate = flops / r["step_s"]
        print(
            f"{name:<20} {r['step_s']:>7.4f} {r['tokens']:>8.0f} {r['tokens'] / r['step_s']:>8.0f} "
            f"{rate / 1e9:>8.1f} {rate / peak:>6.1%} {needed / r['step_s'] / peak:>7.1%} "
            f"{r['load'][0]:.1f}-{r['load'][1]:.1f}"
        )
    print(f"N = {body} (decoder linears) + {head} (output projection); FLOPs/step = 6 * N * tokens")


if __name__ == "__main__":
    main()
