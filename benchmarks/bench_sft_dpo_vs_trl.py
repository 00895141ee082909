"""roll's SFT and DPO training steps against TRL's ``SFTTrainer`` and ``DPOTrainer``, same work, one run.

Both sides train the same tiny Qwen2 (``tiny-1m``, fp32, CPU) with the same tokenizer, rows (built-in arithmetic),
batch (64 sequences per optimizer step: SFT 64 rows, DPO 32 pairs, in 2 micro-batches), AdamW at the same LR, grad
clipping 1.0, ``torch.set_flush_denormal(True)`` and the same thread count. DPO precomputes reference log-probs on
both sides (TRL ``precompute_ref_log_probs=True``), outside the timed steps.

What is timed on our side: ``FSDP2TrainStrategy.train_step`` (the strategy class our ``ActorTrainWorker`` runs)
with our ``SFTLoss`` / ``DPOLoss``, in-process, batches built by the pipelines' own ``common.data`` helpers. With
``--e2e`` it also runs the ``sft`` pipeline through a Ray actor and reports its ``time/step_s`` (driver
included). TRL's steps are timed by a ``TrainerCallback`` from step begin to step end (data loading included, as in
its loop). The first ``--warmup`` steps of each side are not timed. Each side runs in its own subprocess, so peak
RSS (``ru_maxrss``) is that side's alone.

Run: ``uv run python benchmarks/bench_sft_dpo_vs_trl.py [--steps 30 --threads 2 --e2e]``
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

ROWS = 1024
BATCH_SEQS = 64
MICRO_SEQS = 32
LR = 1e-3
MAX_LENGTH = 128
SEED = 0


@dataclass
class Result:
    side: str
    s_per_step: float
    tokens_per_s: float
    final_loss: float
    peak_rss_mb: float


# ----------------------------------------------------------------------------------------------- shared setup


def _setup(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    torch.manual_seed(SEED)


def _model_path() -> str:
    from roll.data.tiny import tiny_model_path

    return str(tiny_model_path("tiny-1m"))


def _rows(kind: Literal["sft", "preference"]) -> tuple[list[dict[str, Any]], Any]:
    """Tokenized rows of the built-in task, exactly as the pipelines prepare them, and the tokenizer."""
    from roll.data.config import DataConfig, DatasetSourceConfig, TokenizeConfig
    from roll.pipelines.common.data import load_tokenizer, prepare_data

    src = DatasetSourceConfig(path="builtin:arithmetic", builtin_kind=kind, max_samples=ROWS)
    tokenizer = load_tokenizer(_model_path())
    data = DataConfig(sources=[src], seed=SEED)
    prepared = prepare_data(data, TokenizeConfig(max_length=MAX_LENGTH), kind=kind, tokenizer=tokenizer)
    return prepared.train, tokenizer


def _summary(side: str, times: list[float], tokens: list[float], losses: list[float]) -> Result:
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s_per_step = sum(times) / len(times)
    return Result(side, s_per_step, sum(tokens) / sum(times), sum(losses[-5:]) / len(losses[-5:]), rss_mb)


# ------------------------------------------------------------------------------------------------ our side


def _our_strategy() -> Any:
    from transformers import AutoModelForCausalLM

    from roll.workers.config import FSDP2Config, OptimizerConfig
    from roll.workers.fsdp2 import FSDP2TrainStrategy

    model = AutoModelForCausalLM.from_pretrained(_model_path())
    config = FSDP2Config(device="cpu", micro_batch_size=MICRO_SEQS, optimizer=OptimizerConfig(lr=LR))
    return FSDP2TrainStrategy(model, config, total_steps=10_000)


def _as_micro_batch(batch: Any) -> dict[str, Any]:
    from roll.workers.roles import columns as C

    tensors = dict(batch.tensors)
    tensors["input_ids"], tensors["attention_mask"] = tensors[C.INPUT_IDS], tensors[C.ATTENTION_MASK]
    return tensors


def _time_steps(
    step: Callable[[int], tuple[float, float]], steps: int, warmup: int
) -> tuple[list[float], ...]:
    times, tokens, losses = [], [], []
    for i in range(warmup + steps):
        start = time.perf_counter()
        loss, n_tokens = step(i)
        if i >= warmup:
            times.append(time.perf_counter() - start)
            tokens.append(n_tokens)
        losses.append(loss)
    return times, tokens, losses


def ours_sft(steps: int, warmup: int) -> Result:
    from roll.pipelines.common.data import sft_batch
    from roll.pipelines.sft.losses import SFTLoss

    rows, tokenizer = _rows("sft")
    strategy, loss_fn = _our_strategy(), SFTLoss()
    batches = [rows[i * BATCH_SEQS : (i + 1) * BATCH_SEQS] for i in range(len(rows) // BATCH_SEQS)]

    def step(i: int) -> tuple[float, float]:
        mb = _as_micro_batch(sft_batch(batches[i % len(batches)], pad_id=tokenizer.pad_token_id))
        result = strategy.train_step(mb, loss_fn)
        return result.loss, float(mb["attention_mask"].sum())

    return _summary("roll sft", *_time_steps(step, steps, warmup))


def ours_dpo(steps: int, warmup: int) -> Result:
    from roll.pipelines.common.columns import LABELS, REF_LOGP
    from roll.pipelines.common.data import pair_batch
    from roll.pipelines.dpo.losses import DPOLoss, response_logp

    rows, tokenizer = _rows("preference")
    strategy, loss_fn = _our_strategy(), DPOLoss(beta=0.1)
    pairs = BATCH_SEQS // 2
    batches = [
        pair_batch(rows[i * pairs : (i + 1) * pairs], pad_id=tokenizer.pad_token_id)
        for i in range(len(rows) // pairs)
    ]
    for batch in batches:  # precompute reference log-probs with the untrained policy (untimed, like TRL)
        mb = _as_micro_batch(batch)
        scores = strategy.compute_logprobs(mb["input_ids"], mb["attention_mask"])
        batch[REF_LOGP] = response_logp(scores.logp_BT, batch.tensors[LABELS])

    def step(i: int) -> tuple[float, float]:
        mb = _as_micro_batch(batches[i % len(batches)])
        result = strategy.train_step(mb, loss_fn)
        return result.loss, float(mb["attention_mask"].sum())

    return _summary("roll dpo", *_time_steps(step, steps, warmup))


# ------------------------------------------------------------------------------------------------ TRL side


def _step_timer(warmup: int, count_tokens: Callable[[dict[str, Any]], float]) -> Any:
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.losses: list[float] = []
            self.start = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step > warmup:
                self.times.append(time.perf_counter() - self.start)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

    return StepTimer()


def _trl_args(steps: int, warmup: int) -> dict[str, Any]:
    return {
        "output_dir": "/tmp/bench-trl",
        "max_steps": steps + warmup,
        "per_device_train_batch_size": MICRO_SEQS,
        "gradient_accumulation_steps": BATCH_SEQS // MICRO_SEQS,
        "learning_rate": LR,
        "lr_scheduler_type": "constant",
        "max_grad_norm": 1.0,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "seed": SEED,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }


def trl_sft(steps: int, warmup: int) -> Result:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer  # type: ignore[attr-defined]

    rows, tokenizer = _rows("sft")
    ds = Dataset.from_list([{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows])
    timer = _step_timer(warmup, lambda b: 0.0)
    args = SFTConfig(**_trl_args(steps, warmup), max_length=MAX_LENGTH)
    model = AutoModelForCausalLM.from_pretrained(_model_path())
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=ds, processing_class=tokenizer, callbacks=[timer]
    )
    trainer.train()
    tokens_per_step = BATCH_SEQS * sum(len(r["input_ids"]) for r in rows) / len(rows)
    return _summary("trl sft", timer.times, [tokens_per_step] * len(timer.times), timer.losses)


def trl_dpo(steps: int, warmup: int) -> Result:
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer  # type: ignore[attr-defined]

    from roll.data.tasks import builtin_dataset

    rows, tokenizer = _rows("preference")
    ds = builtin_dataset("arithmetic", "preference", ROWS, seed=SEED).select_columns(
        ["prompt", "chosen", "rejected"]
    )
    timer = _step_timer(warmup, lambda b: 0.0)
    trl_args = _trl_args(steps, warmup)
    trl_args["per_device_train_batch_size"] = MICRO_SEQS // 2  # pairs
    args = DPOConfig(**trl_args, max_length=MAX_LENGTH, beta=0.1, precompute_ref_log_probs=True)
    model = AutoModelForCausalLM.from_pretrained(_model_path())
    trainer = DPOTrainer(
        model=model, args=args, train_dataset=ds, processing_class=tokenizer, callbacks=[timer]
    )
    trainer.train()
    seq_tokens = sum(2 * len(r["prompt_ids"]) + len(r["chosen_ids"]) + len(r["rejected_ids"]) for r in rows)
    tokens_per_step = BATCH_SEQS // 2 * seq_tokens / len(rows)
    return _summary("trl dpo", timer.times, [tokens_per_step] * len(timer.times), timer.losses)


def e2e_sft(steps: int, warmup: int) -> Result:
    """The ``sft`` pipeline through one Ray actor; s/step from its ``time/step_s`` (driver and dispatch included)."""
    import tempfile
    from pathlib import Path

    from roll.core.config.loader import load_config
    from roll.pipelines.sft import SFTConfig
    from roll.pipelines.sft.pipeline import SFTPipeline

    out = Path(tempfile.mkdtemp()) / "run"
    overrides = [
        f"output_dir={out}", f"max_steps={steps + warmup}", "eval_every=0", "tracking.progress=false",
        "tracking.backends=[jsonl]", "checkpoint.export_hf=false", f"data.sources.0.max_samples={ROWS}",
        f"batch.prompts_per_step={BATCH_SEQS}", f"batch.micro_batch_samples={MICRO_SEQS}",
        f"actor_train.strategy.optimizer.lr={LR}", "actor_train.strategy.scheduler.kind=constant",
        "actor_train.strategy.scheduler.warmup_steps=0",
    ]  # fmt: skip
    cfg = load_config(Path(__file__).parents[1] / "examples" / "sft.yaml", overrides, model=SFTConfig)
    pipeline = SFTPipeline(cfg)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    rows = [json.loads(line)["metrics"] for line in (out / "metrics.jsonl").read_text().splitlines()][warmup:]
    times = [r["time/step_s"] for r in rows]
    return _summary(
        "roll sft (Ray e2e)", times, [r["train/tokens"] for r in rows], [r["train/loss"] for r in rows]
    )


SIDES: dict[str, Callable[[int, int], Result]] = {
    "ours_sft": ours_sft,
    "trl_sft": trl_sft,
    "ours_dpo": ours_dpo,
    "trl_dpo": trl_dpo,
    "e2e_sft": e2e_sft,
}


# ------------------------------------------------------------------------------------------------ driver


def _run_side(name: str, args: argparse.Namespace) -> Result:
    cmd = [sys.executable, __file__, "--side", name, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    cmd += ["--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-4000:]}")
    return Result(**json.loads(proc.stdout.strip().splitlines()[-1]))


def _table(results: dict[str, Result]) -> str:
    lines = [
        f"{'side':<20} {'s/step':>8} {'tokens/s':>10} {'final loss':>11} {'peak RSS MB':>12}",
        *(
            f"{r.side:<20} {r.s_per_step:>8.4f} {r.tokens_per_s:>10.0f} {r.final_loss:>11.4f} {r.peak_rss_mb:>12.0f}"
            for r in results.values()
        ),
    ]
    for mode in ("sft", "dpo"):
        ours, trl = results.get(f"ours_{mode}"), results.get(f"trl_{mode}")
        if ours and trl:
            lines.append(
                f"{mode}: roll/TRL tokens/s = {ours.tokens_per_s / trl.tokens_per_s:.2f}x, "
                f"s/step = {ours.s_per_step / trl.s_per_step:.2f}x, RSS = {ours.peak_rss_mb / trl.peak_rss_mb:.2f}x"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--e2e", action="store_true", help="also time the sft pipeline through a Ray actor")
    parser.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        _setup(args.threads)
        print(json.dumps(asdict(SIDES[args.side](args.steps, args.warmup))))
        return
    names = ["ours_sft", "trl_sft", "ours_dpo", "trl_dpo", *(["e2e_sft"] if args.e2e else [])]
    print(_table({name: _run_side(name, args) for name in names}))


if __name__ == "__main__":
    main()
