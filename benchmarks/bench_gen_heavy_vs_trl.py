"""Generation-dominated GRPO: roll's rlvr pipeline vs TRL's ``GRPOTrainer`` on a ~30M Qwen2, in one run.

The shape (issue 31): a 30.4M-parameter Qwen2 built from a config (hidden 512, 10 layers, 8 heads / 2 KV heads,
head_dim 64, MLP 1536, the tiny kit's 512-token vocabulary), ``P`` = 16 prompts x ``G`` = 8 samples = 128
completions per step, 128 new tokens each. The task (:mod:`gen_heavy_task`): "Write digits, mostly D."; the
reward is the share of D in the completion. A short SFT warm-up (``--warmup-steps``, plain torch, saved once to
a folder both sides load) teaches 200-digit runs with D a fifth of the digits and no end-of-turn, so every
completion on both sides runs to the 128-token limit (step-1 length 128 and hit-max 1.0 on both: equal work) and
rewards vary within every group (binomial), so neither side skips training: GRPO trains on all 128 rows.

Everything else as ``bench_grpo_vs_trl.py`` (whose helpers this imports): temperature 1, token-mean loss, no KL,
one optimizer step per batch (forward/backward in micro-batches of ``--micro`` = 16 rows on both sides: 128
rows of ~150 tokens in one go need ~15 GB of activations), AdamW, grad clip 1, fp32, flushed denormals, ``OMP_WAIT_POLICY=PASSIVE``, the same
thread count, gradient checkpointing off, sides alternating over ``--rounds``. roll's generator is its ``hf``
decode loop (at this size it beats vLLM-on-CPU: see docs/benchmarks; ``--roll-set actor_infer.strategy...``
switches it in the vLLM venv); TRL's is ``model.generate`` (TRL's vLLM mode needs CUDA).

Columns: median s/step (after each round's first step), generated tokens/s of a whole step, generation-only
tokens/s (roll: ``time/generate_s``; TRL: the wall time of ``model.generate``, timed by wrapping it), the box
limit (``2 * N`` FLOP per token against the fp32 matmul peak measured in this run, before and after, the higher
taken, with :func:`bench_mfu.matmul_peak_flops`), the generation rate as a fraction of it, the step-1 length and
hit-max share, the reward at step 1 and over the last steps, peak RSS, and the load average while each side ran.
Quote ratios only when the load column stays under 1.5 on 2 cores.

Run: ``uv run python benchmarks/bench_gen_heavy_vs_trl.py [--steps 3] [--rounds 1]`` (about 8 min on a quiet box;
``--start-model DIR`` reuses the ``start-model`` folder an earlier run warmed, skipping the ~2 min warm-up).
roll's fastest generator at this size is the ``hf`` one in bfloat16 (``bench_decode.py``): add
``--roll-set actor_infer.strategy.dtype=bfloat16`` (the ``actor/mismatch/*`` metrics show the gap to the fp32
trainer), and ``--roll-set actor_train.strategy.mixed_precision=bf16`` trains under bf16 autocast (fp32 weights).
TRL's ``--trl-bf16`` (its ``bf16=True``, the same autocast) trains faster than its fp32 default but generates slower
on this CPU with ``sdpa``, since autocast recasts every weight at every decode step. Both sides' best settings
(2026-12-05): roll ``--roll-set actor_train.strategy.compile=true --roll-set
actor_train.model.attn_implementation=eager`` with the two above, against TRL ``--trl-bf16 --trl-compile
--trl-attention eager`` (its ``torch_compile=True``, and eager attention, whose bf16 ``generate`` is faster than
``sdpa``'s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import bench_grpo_vs_trl as grpo  # process measuring, table printing
import bench_mfu  # the matmul peak
import gen_heavy_task as task

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"hidden_size": 512, "num_hidden_layers": 10, "num_attention_heads": 8, "num_key_value_heads": 2}
INTERMEDIATE = 1536


def warm_model(folder: Path, steps: int, lr: float, threads: int) -> None:
    """Build the 30M Qwen2 from its config (seed 0), SFT it ``steps`` steps on digit runs (batches of 16, loss on
    the answer only), save it with the tiny kit's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll.data.tiny import TinyPreset, tiny_model_path

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    path = tiny_model_path(TinyPreset(intermediate_size=INTERMEDIATE, **SHAPE))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rng = random.Random(0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        rows = []
        for _ in range(16):
            d = rng.randrange(10)
            msgs = [{"role": "user", "content": task.prompt_of(d)}]
            prompt = tok.apply_chat_template(
                msgs, tokenize=True, add_generation_prompt=True, return_dict=False
            )
            answer = tok(task.sft_answer(d, 200, rng), add_special_tokens=False)["input_ids"]
            rows.append((prompt + answer, len(prompt)))
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), width), tok.pad_token_id)
        labels = torch.full((len(rows), width), -100)
        for r, (ids, start) in enumerate(rows):
            input_ids[r, : len(ids)] = torch.tensor(ids)
            labels[r, start : len(ids)] = torch.tensor(ids[start:])
        loss = model(input_ids=input_ids, attention_mask=input_ids != tok.pad_token_id, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def model_sizes(folder: Path) -> tuple[int, int]:
    """(all parameters, ``N`` of the box limit: the weights that multiply every generated token, i.e. the decoder
    linears and the output head)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    return sum(p.numel() for p in model.parameters()), sum(bench_mfu.matmul_params(model))


# ------------------------------------------------------------------------------------------------- TRL side


def trl_main(args: argparse.Namespace) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    rows = task.rl_rows(args.P * 10)
    data = Dataset.from_list([{"prompt": r["messages"], "ground_truth": r["ground_truth"]} for r in rows])

    def reward(completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [task.digit_share(t, g) for t, g in zip(texts, ground_truth)]

    cfg = GRPOConfig(
        output_dir=args.out / "trl", per_device_train_batch_size=args.micro, num_generations=args.G,
        max_completion_length=args.max_new_tokens, learning_rate=args.lr, loss_type="dapo", beta=0.0,
        temperature=1.0, max_steps=args.steps, logging_steps=1, report_to="none", use_cpu=True, bf16=args.trl_bf16,
        torch_compile=args.trl_compile,
        seed=args.seed, max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0, save_strategy="no",
        gradient_accumulation_steps=args.P * args.G // args.micro, dataloader_num_workers=0, activation_checkpointing=False,
    )  # fmt: skip
    log: list[dict[str, float]] = []
    gen_s = [0.0]
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation=args.trl_attention
    )
    plain_generate = model.generate

    def timed_generate(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return plain_generate(*a, **k)
        finally:
            gen_s[0] += time.perf_counter() - start

    model.generate = timed_generate

    class Timer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t, gen_s[0] = time.perf_counter(), 0.0

        def on_log(self, a: Any, state: Any, c: Any, logs: dict[str, float] | None = None, **k: Any) -> None:
            if logs and "reward" in logs:
                log.append({"step_s": time.perf_counter() - self.t, "gen_s": gen_s[0], **logs})

    tok = AutoTokenizer.from_pretrained(args.model)
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=cfg, train_dataset=data, processing_class=tok
    )
    trainer.add_callback(Timer())
    trainer.train()
    (args.out / "trl.json").write_text(json.dumps(log))


# ------------------------------------------------------------------------------------------------ roll side


def roll_overrides(args: argparse.Namespace) -> list[str]:
    data = args.out / "rl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in task.rl_rows(args.P * 10)))
    reward = {"type": "python", "tags": ["digits"], "workers": {"num_workers": 1, "cpus_per_worker": 0.25},
              "options": {"function": f"{Path(task.__file__).resolve()}:digit_share", "timeout_s": None}}  # fmt: skip
    return [
        f"output_dir={args.out / 'roll'}", f"max_steps={args.steps}", "eval_every=0", "~warmup",
        f"data.sources=[{{path: {data}}}]", f"data.eval_sources=[{{path: {data}}}]", "validation.num_prompts=1",
        "~rewards.arithmetic", f"+rewards.digits={json.dumps(reward)}",
        f"actor_train.model.path={args.model}", f"batch.prompts_per_step={args.P}",
        f"batch.samples_per_prompt={args.G}", f"batch.micro_batch_samples={args.micro}",
        f"rollout.request_prompts={args.P}", f"rollout.max_new_tokens={args.max_new_tokens}",
        f"actor_train.strategy.optimizer.lr={args.lr}", f"cpu_threads={args.threads}", "tracking.backends=[jsonl]",
        f"seed={args.seed}", "tracking.progress=false", "plot=false", f"placement={args.placement}",
        "ray.init_timeout_s=300", *args.roll_set,
    ]  # fmt: skip


def roll_main(args: argparse.Namespace) -> None:
    import torch

    from roll.core.config.loader import load_tree, validate
    from roll.pipelines.rlvr import SPEC

    torch.set_flush_denormal(True)
    tree = load_tree(ROOT / "examples" / "quickstart.yaml", roll_overrides(args), model=SPEC.config_model)
    pipeline = SPEC.build(validate(tree, SPEC.config_model))
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()


# ---------------------------------------------------------------------------------------------------- table


def _roll_rows(out: Path, args: argparse.Namespace) -> list[dict[str, float]]:
    rows = [json.loads(line)["metrics"] for line in (out / "roll" / "metrics.jsonl").read_text().splitlines()]
    return [
        {"reward": r["reward/mean"], "s": r["time/step_s"],
         "gen_s": r["time/generate_s"], "len": r["response/length_mean"],
         "clipped": r["response/truncation_rate"], "first": float(i == 0)}
        for i, r in enumerate(rows)
    ]  # fmt: skip


def _trl_rows(out: Path, args: argparse.Namespace) -> list[dict[str, float]]:
    return [
        {"reward": r["reward"], "s": r["step_s"], "gen_s": r["gen_s"], "len": r["completions/mean_length"],
         "clipped": r["completions/clipped_ratio"], "first": float(i == 0)}
        for i, r in enumerate(json.loads((out / "trl.json").read_text()))
    ]  # fmt: skip


def summarize(rows: list[dict[str, float]], args: argparse.Namespace, limit: float) -> dict[str, float]:
    steady = [r for r in rows if not r["first"]] or rows
    rows_per_step = args.P * args.G
    gen_rate = statistics.median(r["len"] * rows_per_step / max(r["gen_s"], 1e-9) for r in steady)
    return {
        "s/step": statistics.median(r["s"] for r in steady),
        "gen tokens/s (step)": statistics.median(
            r["len"] * rows_per_step / max(r["s"], 1e-9) for r in steady
        ),
        "gen-only tokens/s": gen_rate,
        "box limit tokens/s": limit,
        "gen-only / limit": gen_rate / limit,
        "length (step 1)": rows[0]["len"],
        "hit max (step 1)": rows[0]["clipped"],
        "reward (step 1)": rows[0]["reward"],
        "reward (last 2)": sum(r["reward"] for r in rows[-2:]) / len(rows[-2:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--P", type=int, default=16)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument(
        "--micro", type=int, default=16, help="rows per forward/backward (one optimizer step per P x G rows)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup-steps", type=int, default=30)
    parser.add_argument(
        "--start-model", type=Path, default=None, help="reuse a start-model folder an earlier run warmed"
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternate the sides this many times")
    parser.add_argument("--placement", choices=["separate", "hybrid"], default="hybrid")
    parser.add_argument("--roll-set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--trl-bf16",
        action="store_true",
        help="TRL's bf16=True (CPU autocast: its generate and training in bf16); slower than fp32 at this size",
    )
    parser.add_argument(
        "--trl-compile", action="store_true", help="TRL's torch_compile=True (the training forward compiled)"
    )
    parser.add_argument(
        "--trl-attention", choices=["sdpa", "eager"], default=None, help="TRL's model attn_implementation"
    )
    parser.add_argument("--side", choices=["trl", "roll"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "trl":
        return trl_main(args)
    if args.side == "roll":
        return roll_main(args)
    compare(args)


def compare(args: argparse.Namespace) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # the warm-up and the peak run in this process
    out = Path(tempfile.mkdtemp(prefix="bench_gen_heavy_"))
    model = out / "start-model"
    print(f"load average at start: {os.getloadavg()}, cores: {os.cpu_count()}", flush=True)
    peaks = [bench_mfu.matmul_peak_flops(args.threads, 20)]
    if args.start_model is None:
        warm_model(model, args.warmup_steps, 1e-3, args.threads)
    else:
        model = args.start_model
    params, n_matmul = model_sizes(model)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "OMP_WAIT_POLICY": "PASSIVE",
        "PYTHONHASHSEED": "0",
    }
    flags = [
        f"--{k}={v}"
        for k, v in (
            ("steps", args.steps), ("P", args.P), ("G", args.G), ("max-new-tokens", args.max_new_tokens),
            ("lr", args.lr), ("micro", args.micro), ("threads", args.threads), ("placement", args.placement), ("seed", args.seed),
        )
    ]  # fmt: skip
    flags += [f"--roll-set={kv}" for kv in args.roll_set] + (["--trl-bf16"] if args.trl_bf16 else [])
    flags += (["--trl-compile"] if args.trl_compile else []) + (
        [f"--trl-attention={args.trl_attention}"] if args.trl_attention else []
    )
    read = {"roll": _roll_rows, "trl": _trl_rows}
    rows: dict[str, list[dict[str, float]]] = {"roll": [], "trl": []}
    peak_rss = {"roll": 0, "trl": 0}
    loads: dict[str, list[float]] = {"roll": [], "trl": []}
    for round_ in range(args.rounds):
        for side in ("roll", "trl") if round_ % 2 == 0 else ("trl", "roll"):
            side_out = out / f"round{round_}"
            side_out.mkdir(exist_ok=True)
            cmd = [
                sys.executable,
                __file__,
                "--model",
                str(model),
                "--out",
                str(side_out),
                *flags,
                "--side",
                side,
            ]
            _, rss = grpo.run_measured(cmd, env, loads[side])
            peak_rss[side] = max(peak_rss[side], rss)
            rows[side] += read[side](side_out, args)
    # before and after, the higher taken: a neighbour on a core halves a 2-thread matmul, and a low peak inflates
    peaks.append(bench_mfu.matmul_peak_flops(args.threads, 20))
    limit = max(peaks) / (2 * n_matmul)
    print(
        f"model: {params / 1e6:.1f}M parameters ({n_matmul / 1e6:.1f}M in matmuls), {args.P}x{args.G} completions"
        f" of {args.max_new_tokens} tokens; fp32 matmul peak (before, after): "
        + ", ".join(f"{p / 1e9:.1f}" for p in peaks)
        + f" GFLOP/s -> box limit {limit:.0f} tokens/s (2 x N FLOP per token)"
    )
    table = {side: summarize(rows[side], args, limit) for side in ("roll", "trl")}
    for side in table:
        table[side]["peak RSS GB"] = peak_rss[side] / 2**30
        table[side]["load min"] = min(loads[side], default=float("nan"))
        table[side]["load max"] = max(loads[side], default=float("nan"))
    grpo.print_table(table)
    for side in ("roll", "trl"):
        curve = " ".join(f"{r['reward']:.3f}" for r in rows[side])
        print(f"{side} reward curve: {curve}")


if __name__ == "__main__":
    main()
