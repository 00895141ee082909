"""Throughput of roll's SFT tokenization on built-in arithmetic samples, with a per-row baseline for scale.

Runs :func:`roll.data.tokenize.tokenize_dataset` (``kind="sft"``: incremental-prefix turn segmentation, one
batched tokenizer call per map batch, label masks, length policy) over ``--n`` samples of the built-in arithmetic
task with the offline ``roll-tiny`` tokenizer, for each ``--num-proc``, with the ``datasets`` cache off so every
run does the work. The baseline is what TRL-style code does per row: ``apply_chat_template(tokenize=True,
return_assistant_tokens_mask=True)`` (it relies on ``{% generation %}`` markers, which roll's template has),
timed on a slice and in one process. Prints one table: seconds, samples/s, tokens/s.

Usage: ``uv run python benchmarks/bench_tokenize.py [--n 100000] [--num-proc 1 2] [--baseline-n 10000] [--level 4]``
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # forked map workers must not inherit Rust threads

import datasets

from roll.data.config import TokenizeConfig
from roll.data.tasks import builtin_dataset
from roll.data.tokenize import tokenize_dataset
from roll.data.tokenizer import build_tokenizer


def run_roll(ds: datasets.Dataset, tokenizer: Any, num_proc: int) -> tuple[float, int]:
    cfg = TokenizeConfig(
        max_length=512, num_proc=num_proc if num_proc > 1 else None, load_from_cache_file=False
    )
    start = time.perf_counter()
    out, report = tokenize_dataset(ds, kind="sft", tokenizer=tokenizer, cfg=cfg, batch_size=1000)
    seconds = time.perf_counter() - start
    assert report.total == len(ds), report
    return seconds, int(sum(out["length"]))


def run_baseline(ds: datasets.Dataset, tokenizer: Any) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = 0
    for messages in ds["messages"]:
        enc = tokenizer.apply_chat_template(
            messages, tokenize=True, return_assistant_tokens_mask=True, return_dict=True
        )
        tokens += len(enc["input_ids"])
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--num-proc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--baseline-n", type=int, default=10_000)
    parser.add_argument(
        "--level", type=int, default=4, help="arithmetic level; 1-3 hold fewer than 100k problems"
    )
    args = parser.parse_args()
    datasets.disable_progress_bars()
    tokenizer = build_tokenizer()
    start = time.perf_counter()
    ds = builtin_dataset("arithmetic", "sft", args.n, seed=0, options={"level": args.level})
    print(f"built {len(ds)} arithmetic SFT samples in {time.perf_counter() - start:.1f}s", flush=True)
    rows = [
        (f"roll tokenize_dataset num_proc={p}", len(ds), *run_roll(ds, tokenizer, p)) for p in args.num_proc
    ]
    if args.baseline_n:
        part = ds.select(range(min(args.baseline_n, len(ds))))
        rows.append(("per-row apply_chat_template (baseline)", len(part), *run_baseline(part, tokenizer)))
    print(f"{'pipeline':<42} {'samples':>8} {'seconds':>8} {'samples/s':>10} {'tokens/s':>10}")
    for name, n, seconds, tokens in rows:
        print(f"{name:<42} {n:>8} {seconds:>8.2f} {n / seconds:>10.0f} {tokens / seconds:>10.0f}", flush=True)


if __name__ == "__main__":
    main()
