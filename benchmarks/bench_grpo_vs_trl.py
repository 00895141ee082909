"""GRPO, roll's rlvr pipeline vs TRL's ``GRPOTrainer``, on the same work in one run.

Same on both sides: the starting model (the tiny-1m preset after the quickstart's SFT warm-up, answer tokens
only, saved once to a folder both load; it answers in the format and stops at ``<|im_end|>``, so at step 1 both
sides sample the same completion lengths and entropy), tokenizer and chat template, prompts (built-in one-digit arithmetic), reward function (the
``arithmetic`` reward: exact answer), group size ``G``, prompts per step ``P``, max new tokens, temperature 1,
token-mean loss aggregation (TRL ``loss_type="dapo"``, roll ``loss_agg_mode: token-mean``), group-std advantage
scaling, no KL (``beta=0``), one optimizer step per generation batch, AdamW at the same learning rate, grad clip
1.0, fp32, ``torch.set_flush_denormal(True)`` where a model runs, seed 0, the same torch thread count, ``OMP_WAIT_POLICY=PASSIVE``
(spin-waiting OpenMP threads make either side several times slower on a shared box).

Gradient checkpointing is off on both sides (TRL's ``GRPOConfig`` turns it on by default; roll's ``fsdp2``
leaves it off; with TRL's default on, TRL recomputes activations and the ratio flatters roll by ~1.1x).
Denormals are flushed in every roll process that runs a model (``roll.workers.roles.model.load_model``; roll's driver
imports no torch), and the Ray that roll starts passes ``OMP_WAIT_POLICY=PASSIVE`` to its actors.

Differences that remain, by design: roll runs generation, training and rewards in separate Ray actors (so its
peak RSS counts every process of the run, summed with psutil over the process tree), TRL in one process with
``model.generate``; roll's trainer and generator share one actor (``--placement hybrid``, the quickstart's and the
default here) or run as two (``--placement separate``). Reported per side: the
median seconds per step (after the first, which includes start-up), the median of per-step generated tokens/s,
peak RSS, accuracy over the last 3 steps and at step 1, the completion length and the share of completions that
hit the token limit at step 1 (the check that both sides generate the same work: the same model samples them) and
averaged over the run (which also reflects where training took each side), the 1-minute load average seen while the
side ran (min-max of samples every 0.5 s); and the ratios roll/TRL. Sides alternate over ``--rounds`` (roll first
in odd rounds, TRL first in even ones) and their steady steps are pooled. Quote a ratio only when the load column
stays under 1.5 on 2 cores: under load the side with more processes loses more.

Same work: at step 1 both sides sample from the same model, so their completion lengths and hit-max shares agree.
Later steps part unless the start model is strong enough: with the quickstart's 90 warm-up steps (accuracy ~0.1 at
step 1 here), GRPO at lr 5e-4 on either side could drift into completions that run to the token limit and stay
there (the ``arithmetic`` reward reads the last ``answer is N``, so it still pays an answer followed by more text):
roll in 3 of 3 seeds over 20 steps, TRL in 1 of 3, and roll again at 0.87 of completions at the limit over 30
steps. The default warm-up is therefore 240 steps (accuracy ~0.19 at step 1): over 30 steps both sides then keep
the same lengths (seed 0, quiet box: mean completion length 7.52 roll vs 7.27 TRL, 0.1% at the limit on both) and
the same accuracy (0.30 vs 0.29 over the last 3 steps), so ``s/step`` compares equal work. Check the mean
completion-length and hit-max rows before quoting ``s/step``; ``--seed`` reruns both sides on another seed.

Run: ``uv run python benchmarks/bench_grpo_vs_trl.py --steps 10 [--rounds 2] [--placement separate]
[--roll-set KEY=VALUE]`` (roll's side is the quickstart's config: since it sends all 32 prompts in one
generation request, ``rollout.request_prompts=8`` is the earlier four requests of 64 rows).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
LEVEL = (
    0  # one-digit sums a+b: the quickstart's task until 2026-12-03, and the one the benchmarks page measured
)


def tree_rss(pid: int) -> int:
    """Bytes of resident memory of ``pid`` and all its descendants (Ray's raylet, workers ...)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):  # a process may exit while we sum
            total += p.memory_info().rss
    return total


def run_measured(cmd: list[str], env: dict[str, str], loads: list[float] | None = None) -> tuple[float, int]:
    """Run ``cmd``; return (wall seconds, peak summed RSS of its process tree in bytes). ``loads`` (when given)
    receives the 1-minute load average sampled with the RSS, every 0.5 s."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        if loads is not None:
            loads.append(os.getloadavg()[0])
        time.sleep(0.5)
    if proc.returncode:
        raise SystemExit(f"{cmd[:3]} failed with {proc.returncode}")
    return time.perf_counter() - start, peak


# ------------------------------------------------------------------------------------------ the start model


def warm_model(folder: Path, steps: int, lr: float, threads: int) -> None:
    """The quickstart's SFT warm-up (its data, batch size and lr; `steps` of them), in plain torch: tiny-1m on 80 one-digit-sum SFT rows, batches of 32, the
    loss on the assistant answer (and its ``<|im_end|>``) only. Saved as an HF folder both sides load, so both
    start from the same policy, one that answers in the format and stops at ``<|im_end|>``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll.data.models import resolve_model_path
    from roll.data.tasks import builtin_dataset

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    path = resolve_model_path("tiny-1m")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rows = builtin_dataset("arithmetic", "sft", 80, options={"level": LEVEL})
    encoded = []
    for r in rows:
        full = tok.apply_chat_template(r["messages"], tokenize=True, return_dict=False)
        prompt = tok.apply_chat_template(
            r["messages"][:-1], tokenize=True, add_generation_prompt=True, return_dict=False
        )
        # the template ends the answer with "<|im_end|>\n": train up to and including <|im_end|>
        end = full.index(tok.eos_token_id, len(prompt)) + 1
        encoded.append((full[:end], len(prompt)))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for i in range(steps):
        chunk = [encoded[(i * 32 + j) % len(encoded)] for j in range(32)]
        width = max(len(ids) for ids, _ in chunk)
        input_ids = torch.full((32, width), tok.pad_token_id)
        labels = torch.full((32, width), -100)
        for row, (ids, start) in enumerate(chunk):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, start : len(ids)] = torch.tensor(ids[start:])
        loss = model(input_ids=input_ids, attention_mask=input_ids != tok.pad_token_id, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


# ------------------------------------------------------------------------------------------------- TRL side


def trl_main(args: argparse.Namespace) -> None:
    from roll.data.tasks import builtin_dataset
    from roll.pipelines.rewards.arithmetic import ArithmeticReward
    from roll.pipelines.rewards.types import RewardRequest

    rl = builtin_dataset("arithmetic", "rl", 80, options={"level": LEVEL})
    scorer = ArithmeticReward()

    def reward(completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        reqs = [RewardRequest(response=t, ground_truth=g) for t, g in zip(texts, ground_truth)]
        return [r.score for r in scorer.score(reqs)]

    trl_grpo(args, [{"prompt": r["messages"], "ground_truth": r["ground_truth"]} for r in rl], reward)


def trl_grpo(args: argparse.Namespace, rows: list[dict[str, Any]], reward: Any) -> None:
    """TRL's ``GRPOTrainer`` from ``args.model`` on ``rows`` (``prompt`` and the reward's columns) with ``reward``
    (a TRL reward callable); each step's seconds and TRL's logs go to ``args.out / "trl.json"``. Shared with the
    other GRPO benchmarks (bench_small_batch_vs_trl.py), so every comparison runs TRL the same way."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    data = Dataset.from_list(rows)
    cfg = GRPOConfig(
        output_dir=args.out / "trl", per_device_train_batch_size=args.P * args.G, num_generations=args.G,
        max_completion_length=args.max_new_tokens, learning_rate=args.lr, loss_type="dapo", beta=0.0,
        temperature=1.0, max_steps=args.steps, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
        seed=args.seed, max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0, save_strategy="no",
        gradient_accumulation_steps=1, dataloader_num_workers=0, activation_checkpointing=False,
    )  # fmt: skip
    log: list[dict[str, float]] = []

    class Timer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t = time.perf_counter()

        def on_log(self, a: Any, state: Any, c: Any, logs: dict[str, float] | None = None, **k: Any) -> None:
            if logs and "reward" in logs:
                log.append({"step_s": time.perf_counter() - self.t, **logs})

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(args.model)
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=cfg, train_dataset=data, processing_class=tok
    )
    trainer.add_callback(Timer())
    trainer.train()
    (args.out / "trl.json").write_text(json.dumps(log))


# ------------------------------------------------------------------------------------------------ roll side


def roll_overrides(args: argparse.Namespace) -> list[str]:
    return [
        f"output_dir={args.out / 'roll'}", f"max_steps={args.steps}", "eval_every=0", "~warmup",
        f"data.sources.0.builtin_options={{level: {LEVEL}}}", "data.sources.0.max_samples=80",  # TRL's rows
        f"data.eval_sources.0.builtin_options={{level: {LEVEL}}}", "data.eval_sources.0.max_samples=12",
        f"actor_train.model.path={args.model}", f"batch.prompts_per_step={args.P}", f"batch.samples_per_prompt={args.G}",
        f"batch.micro_batch_samples={args.P * args.G}", f"rollout.max_new_tokens={args.max_new_tokens}",
        f"actor_train.strategy.optimizer.lr={args.lr}", f"cpu_threads={args.threads}", "tracking.backends=[jsonl]",
        f"seed={args.seed}",
        "tracking.progress=false", "plot=false", f"placement={args.placement}", "ray.init_timeout_s=300",
        "failures.max_steps_without_update=0",  # a throughput run from an unwarmed model must not stop early
        *args.roll_set,
    ]  # fmt: skip


def roll_main(args: argparse.Namespace) -> None:
    roll_rlvr(ROOT / "examples" / "quickstart.yaml", roll_overrides(args))


def roll_rlvr(yaml: Path, overrides: list[str]) -> None:
    """roll's rlvr pipeline on ``yaml`` with dotted ``overrides``, in this process (as ``roll train`` runs it).

    Torch is never imported here: roll's rlvr driver carries none (its model processes flush denormals
    themselves), so this process's RSS is the driver's, as under ``roll train``."""
    from roll.core.config.loader import load_tree, validate
    from roll.pipelines.rlvr import SPEC

    tree = load_tree(yaml, overrides, model=SPEC.config_model)
    pipeline = SPEC.build(validate(tree, SPEC.config_model))
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()


# ---------------------------------------------------------------------------------------------------- table


def summarize(rows: list[dict[str, float]], wall: float, rss: int, loads: list[float]) -> dict[str, float]:
    """One side's table column. ``rows`` are the steps of every round, each round's first step (start-up)
    already dropped where a later step exists; medians, so one step slowed by a neighbour moves nothing."""
    steady = [r for r in rows if not r.get("first")] or rows
    return {
        "s/step": statistics.median(r["s"] for r in steady),
        "gen tokens/s": statistics.median(r["tok"] / max(r["s"], 1e-9) for r in steady),
        "peak RSS GB": rss / 2**30,
        "accuracy (last 3)": sum(r["acc"] for r in rows[-3:]) / len(rows[-3:]),
        "accuracy (step 1)": rows[0]["acc"],
        "completion length (step 1)": rows[0]["len"],
        "hit max tokens (step 1)": rows[0]["clipped"],
        "completion length": sum(r["len"] for r in rows) / len(rows),
        "hit max tokens": sum(r["clipped"] for r in rows) / len(rows),
        "wall s": wall,
        "load min": min(loads, default=float("nan")),
        "load max": max(loads, default=float("nan")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--P", type=int, default=32)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="both sides' run seed (sampling, data order)")
    parser.add_argument("--warmup-steps", type=int, default=240)
    parser.add_argument("--rounds", type=int, default=1, help="alternate the sides this many times")
    parser.add_argument("--placement", choices=["separate", "hybrid"], default="hybrid")
    parser.add_argument(
        "--roll-set", action="append", default=[], metavar="KEY=VALUE",
        help="an extra override for roll's side (repeatable), e.g. rollout.request_prompts=32",
    )  # fmt: skip
    parser.add_argument("--side", choices=["trl", "roll"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "trl":
        return trl_main(args)
    if args.side == "roll":
        return roll_main(args)
    compare(args)


def _roll_rows(out: Path, args: argparse.Namespace) -> list[dict[str, float]]:
    lines = (out / "roll" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line)["metrics"] for line in lines]
    return [
        {
            "acc": r["reward/accuracy"],
            "s": r["time/step_s"],
            "tok": r["response/length_mean"] * args.P * args.G,
            "len": r["response/length_mean"],
            "clipped": r["response/truncation_rate"],
            "first": float(i == 0),
        }
        for i, r in enumerate(rows)
    ]


def _trl_rows(out: Path, args: argparse.Namespace) -> list[dict[str, float]]:
    return [
        {
            "acc": r["reward"],
            "s": r["step_s"],
            "tok": r["completions/mean_length"] * args.P * args.G,
            "len": r["completions/mean_length"],
            "clipped": r["completions/clipped_ratio"],
            "first": float(i == 0),
        }
        for i, r in enumerate(json.loads((out / "trl.json").read_text()))
    ]


def compare(args: argparse.Namespace) -> None:
    # the warm-up below trains in this process: idle OpenMP threads must not spin (read when torch loads)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    out = Path(tempfile.mkdtemp(prefix="bench_grpo_"))
    model = out / "start-model"
    warm_model(model, args.warmup_steps, 3e-3, args.threads)
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
            ("lr", args.lr), ("threads", args.threads), ("placement", args.placement), ("seed", args.seed),
        )
    ]  # fmt: skip
    flags += [f"--roll-set={kv}" for kv in args.roll_set]
    print_table(alternate(Path(__file__), model, out, flags, env, args))


def alternate(
    script: Path, model: Path, out: Path, flags: list[str], env: dict[str, str], args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    """Run ``script --side roll`` and ``--side trl`` in turn over ``args.rounds`` (roll first in odd rounds, TRL
    first in even ones), each in its own process tree; the table of :func:`summarize` per side."""
    read = {"roll": _roll_rows, "trl": _trl_rows}
    rows: dict[str, list[dict[str, float]]] = {"roll": [], "trl": []}
    walls: dict[str, list[float]] = {"roll": [], "trl": []}
    peaks: dict[str, int] = {"roll": 0, "trl": 0}
    loads: dict[str, list[float]] = {"roll": [], "trl": []}
    print(f"load average at start: {os.getloadavg()}, cores: {os.cpu_count()}")
    for round_ in range(args.rounds):
        for side in ("roll", "trl") if round_ % 2 == 0 else ("trl", "roll"):
            side_out = out / f"round{round_}"
            side_out.mkdir(exist_ok=True)
            cmd = [sys.executable, str(script), "--model", str(model), "--out", str(side_out), *flags]
            wall, rss = run_measured([*cmd, "--side", side], env, loads[side])
            walls[side].append(wall)
            peaks[side] = max(peaks[side], rss)
            rows[side] += read[side](side_out, args)
    return {
        side: summarize(rows[side], statistics.median(walls[side]), peaks[side], loads[side])
        for side in ("roll", "trl")
    }


def print_table(table: dict[str, dict[str, float]]) -> None:
    keys = list(table["roll"])
    print(f"\n{'metric':<20}{'roll':>12}{'trl':>12}{'roll/trl':>12}")
    for k in keys:
        a, b = table["roll"][k], table["trl"][k]
        print(f"{k:<20}{a:>12.3f}{b:>12.3f}{(a / b if b else float('nan')):>12.2f}")


if __name__ == "__main__":
    main()
