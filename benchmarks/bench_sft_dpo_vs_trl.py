"""roll's SFT and DPO training steps against TRL's ``SFTTrainer`` and ``DPOTrainer``, same work, one run.

Both sides train the same tiny Qwen2 (``tiny-1m``, fp32, CPU) from the same initial weights on the *same batches
in the same order*: the rows are the built-in arithmetic task tokenized by roll's pipelines, and TRL reads them
with ``train_sampling_strategy="sequential"`` (SFT: the token ids and labels as they are; DPO: the same
prompt/chosen/rejected messages, which TRL tokenizes with the same chat template; the benchmark checks that TRL's
token ids equal ours). A step is 64 sequences (SFT 64 rows, DPO 32 pairs) in 2 micro-batches, right-padded to the
longest sequence of the step (ours) or of the micro-batch (TRL's collator; these rows differ by a few tokens); AdamW at the same LR and defaults
(torch's fused kernel on both sides: TRL's default ``adamw_torch_fused``, ours since the fsdp2 strategy picks it),
constant schedule, grad clipping 1.0, fp32 and gradient checkpointing off (TRL's configs default to bf16 autocast, on CPU too, and to checkpointing;
with those defaults TRL did different work, its loss off ours by 2e-3, and ran ~2x slower relative to ours;
``--grad-checkpointing`` turns checkpointing on for both). DPO
reads reference log-probs computed once up front on both sides (TRL ``precompute_ref_log_probs=True``, so
no reference model is kept or run during the steps), outside the timed steps. Our DPO step runs with the fsdp2
strategy's ``pair_prefix`` (on by default): each chosen/rejected pair is one row, its common prefix (the prompt
and any shared response tokens) once, the rejected tokens masked off the chosen ones (:mod:`roll.workers.pair_prefix`;
same scores and gradients, ~0.65 of the token positions here). TRL has no equivalent in this version (its DPO
concatenates chosen and rejected as separate rows), so its best DPO is the padded default. ``--ab`` adds our DPO
step without it, interleaved, for the before/after; ``cpu s`` is the process's CPU time per step (all threads),
the figure least moved by a loaded box.

Same process conditions on both sides: ``torch.set_flush_denormal(True)``, ``torch.set_num_threads(--threads)``
(checked inside TRL's loop), ``OMP_WAIT_POLICY=PASSIVE`` (``--omp-wait``). The last one matters on a shared box: a
step of either side took 8-11 s instead of 0.4-0.7 s at load average ~15 on 2 cores with libgomp's default
spin-waiting threads, which is where an earlier "TRL DPO 9 s/step against our 0.14 s" came from (the sides ran at
different moments of a changing load). Sides also alternate over ``--rounds`` rounds and each row of the table
gives the load average seen while it ran. ``best s`` (the fastest timed step of a side) is the figure least moved by
the other processes of a shared box; the median and tokens/s can swing by 1.5x between runs under a changing load.

Where the time goes (``--profile``, 2 threads): ~50% ``aten::mm`` (the model's linear layers, the same calls on both
sides), then the model's elementwise ops (SiLU * up, RMSNorm, RoPE) and SDPA; our own log-prob path is one fused
``cross_entropy`` per micro-batch and our step issues fewer copies than TRL's. Both sides run the same transformers
forward and backward, so at equal work the step times are close and the ratio mostly shows the noise of a shared box.

What is timed: our side, ``FSDP2TrainStrategy.train_step`` (the strategy our ``ActorTrainWorker`` runs) with our
``SFTLoss`` / ``DPOLoss``, in-process, batch building included; TRL, its ``training_step``s plus optimizer step, by
a ``TrainerCallback`` from step begin to step end (its data loading included, as in its loop). Tokens are the real
(non-padding) tokens of each step: ours from the attention mask, TRL's from its own ``num_tokens`` log. The first
``--warmup`` steps are not timed. Each side runs in its own subprocess, so peak RSS (``ru_maxrss``) is that side's
alone. ``max |loss diff|`` compares the two sides' loss at every step (same batches, same weights): it shows the
sides do the same work, so tokens/s compare at equal loss. ``--profile`` prints the top ops of one step per side.

Tables (``--settings``): ``defaults`` keeps both sides' speed options at their defaults (padded batches; the
same fp32 and checkpointing as above, so the work is equal), ``padding_free`` turns on each side's padding-free
path (ours ``packed``, TRL SFT ``padding_free``; TRL DPO has none in this version, so it stays padded),
``compiled`` turns on each side's ``torch.compile`` (ours: the fsdp2 strategy's ``compile``, each decoder layer;
TRL: ``torch_compile=True``, the whole model; inductor on CPU; the compile runs in the untimed warm-up steps) and
``compiled_eager_attention`` adds transformers' ``eager`` attention on both sides (on these ~27-token rows its
matmuls and softmax, fused by inductor, beat the CPU flash-attention kernel of ``sdpa``). With two or more
tables, a "best vs best" line per mode sets each side's faster setting (lower median s/step) against the other's
(TRL's DPO, whose two runs are one configuration, counts as both of them pooled):
on CPU with sdpa the padding-free layout is the slower one (one ``[1, N]`` row attends through an ``[N, N]``
block-diagonal mask instead of ``B`` small causal blocks), so padded is usually each side's best here; compiled,
each side gains ~10-20% per step. ``--e2e`` also runs our ``sft`` and ``dpo`` pipelines (one Ray actor, the same
rows, sizes and LR) and prints them against TRL's whole-loop step interval: both sides' real entry points.
Medians throughout (``s/step``); sides alternate (their order reverses every other round).

Run: ``uv run python benchmarks/bench_sft_dpo_vs_trl.py [--steps 30 --rounds 2 --settings defaults,padding_free --e2e]``;
SFT best vs best with compilation: ``--modes sft --steps 20 --rounds 2 --settings defaults,compiled,compiled_eager_attention``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

ROWS = 1024
BATCH_SEQS = 64
MICRO_SEQS = 32
LR = 1e-3
MAX_LENGTH = 128
SEED = 0
PROFILE_ROWS = 8
CHECKPOINTING_ENV = "BENCH_GRAD_CHECKPOINTING"
SETTING_ENV = "BENCH_SETTING"
SETTINGS = ("defaults", "padding_free", "compiled", "compiled_eager_attention")


@dataclass
class Result:
    side: str
    step_s: list[float]
    tokens: list[float]
    losses: list[float]
    peak_rss_mb: float
    threads: int
    load: list[float] = field(default_factory=list)
    profile: str = ""
    cpu_s: list[float] = field(default_factory=list)
    """CPU seconds of the process per timed step (``time.process_time``, all its threads): less moved by the other
    processes of a shared box than wall time."""
    e2e_s: list[float] = field(default_factory=list)
    """Seconds per step through the side's real entry point: TRL, the interval between its loop's step ends
    (data loading, logging and callbacks included); ours, the pipeline's ``time/step_s`` (driver and Ray)."""

    @property
    def s_per_step(self) -> float:
        return statistics.median(self.step_s)

    @property
    def best_s(self) -> float:
        """The fastest timed step: the least disturbed by other processes on a shared box."""
        return min(self.step_s)

    @property
    def cpu_per_step(self) -> float:
        return statistics.median(self.cpu_s) if self.cpu_s else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens) / sum(self.step_s)

    @property
    def final_loss(self) -> float:
        return sum(self.losses[-5:]) / len(self.losses[-5:])


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


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _threads() -> int:
    import torch

    return int(torch.get_num_threads())


class _Profiler:
    """Top ops (self CPU time) of one step; a no-op unless asked."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.table = enabled, ""
        self._prof: Any = None

    def start(self) -> None:
        if self.enabled:
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU])
            self._prof.start()

    def stop(self) -> None:
        if self._prof is not None:
            self._prof.stop()
            averages = self._prof.key_averages()
            self.table = averages.table(sort_by="self_cpu_time_total", row_limit=PROFILE_ROWS)
            self._prof = None


# ------------------------------------------------------------------------------------------------ our side


def _grad_checkpointing() -> bool:
    return os.environ.get(CHECKPOINTING_ENV) == "1"


def _best() -> bool:
    """``--settings padding_free``: each side's padding-free layout. Ours: ``packed`` forwards;
    TRL's SFT: ``padding_free=True`` (its collator flattens the batch into one row with restarting position ids,
    the same layout). TRL's DPO has no padding-free mode in this version (``padding_free=True`` warns and pads)."""
    return os.environ.get(SETTING_ENV) == "padding_free"


def _compiled() -> bool:
    """``--settings compiled``: each side's ``torch.compile``. Ours: the fsdp2 strategy's ``compile`` (each
    decoder layer, ``dynamic=True``); TRL: ``torch_compile=True`` (the Trainer compiles the whole model, its loss
    inside, with torch's default automatic dynamic shapes). Inductor on CPU on both sides; the compile runs in
    the untimed warm-up steps."""
    return os.environ.get(SETTING_ENV, "").startswith("compiled")


def _attention() -> str:
    """transformers' attention kernel, the same on both sides: ``sdpa`` (its default), or ``eager`` in the
    ``compiled_eager_attention`` setting (attention as matmuls and a softmax that inductor fuses; on rows of ~27
    tokens that beats the CPU flash-attention kernel, which costs ~15% of a compiled step with ``sdpa``)."""
    return "eager" if os.environ.get(SETTING_ENV) == "compiled_eager_attention" else "sdpa"


def _our_strategy(pair_prefix: bool = True) -> Any:
    from transformers import AutoModelForCausalLM

    from roll.workers.config import FSDP2Config, OptimizerConfig
    from roll.workers.fsdp2 import FSDP2TrainStrategy

    model = AutoModelForCausalLM.from_pretrained(_model_path(), attn_implementation=_attention())
    config = FSDP2Config(
        device="cpu",
        micro_batch_size=MICRO_SEQS,
        optimizer=OptimizerConfig(lr=LR),
        gradient_checkpointing=_grad_checkpointing(),
        packed=_best(),
        compile=_compiled(),
        pair_prefix=pair_prefix,
    )
    return FSDP2TrainStrategy(model, config, total_steps=10_000)


def _as_micro_batch(batch: Any) -> dict[str, Any]:
    from roll.core import columns as C

    tensors = dict(batch.tensors)
    tensors["input_ids"], tensors["attention_mask"] = tensors[C.INPUT_IDS], tensors[C.ATTENTION_MASK]
    return tensors


def _run_ours(
    name: str, step: Callable[[int], tuple[float, float]], steps: int, warmup: int, profile: bool
) -> Result:
    times, cpu, tokens, losses = [], [], [], []
    for i in range(warmup + steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        loss, n_tokens = step(i)
        if i >= warmup:
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
            tokens.append(n_tokens)
        losses.append(loss)
    prof = _Profiler(profile)
    prof.start()
    step(warmup + steps)
    prof.stop()
    return Result(name, times, tokens, losses, _rss_mb(), _threads(), profile=prof.table, cpu_s=cpu)


def _batches(rows: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    """Consecutive batches of ``size`` rows: the order TRL's sequential sampler reads them in."""
    return [rows[i * size : (i + 1) * size] for i in range(len(rows) // size)]


def ours_sft(steps: int, warmup: int, profile: bool) -> Result:
    from roll.pipelines.common.data import sft_batch
    from roll.pipelines.sft.losses import SFTLoss

    rows, tokenizer = _rows("sft")
    strategy, loss_fn = _our_strategy(), SFTLoss()
    batches = _batches(rows, BATCH_SEQS)

    def step(i: int) -> tuple[float, float]:
        mb = _as_micro_batch(sft_batch(batches[i % len(batches)], pad_id=tokenizer.pad_token_id))
        result = strategy.train_step(mb, loss_fn)
        return result.loss, float(mb["attention_mask"].sum())

    return _run_ours("roll sft", step, steps, warmup, profile)


def ours_dpo(steps: int, warmup: int, profile: bool, pair_prefix: bool = True) -> Result:
    from roll.core.columns import LABELS, REF_SEQ_LOGP
    from roll.pipelines.common.data import pair_batch
    from roll.pipelines.dpo.losses import DPOLoss, response_logp

    rows, tokenizer = _rows("preference")
    strategy, loss_fn = _our_strategy(pair_prefix), DPOLoss(beta=0.1)
    batches = [pair_batch(b, pad_id=tokenizer.pad_token_id) for b in _batches(rows, BATCH_SEQS // 2)]
    for batch in batches:  # precompute reference log-probs with the untrained policy (untimed, like TRL)
        mb = _as_micro_batch(batch)
        scores = strategy.compute_logprobs(mb["input_ids"], mb["attention_mask"])
        batch[REF_SEQ_LOGP] = response_logp(scores.logp_BT, batch.tensors[LABELS])

    def step(i: int) -> tuple[float, float]:
        mb = _as_micro_batch(batches[i % len(batches)])
        result = strategy.train_step(mb, loss_fn)
        return result.loss, float(mb["attention_mask"].sum())

    return _run_ours("roll dpo" if pair_prefix else "roll dpo, no pair", step, steps, warmup, profile)


def plain_dpo(steps: int, warmup: int, profile: bool) -> Result:
    """Our DPO step without ``pair_prefix`` (each pair's prompt run twice): the before of ``--ab``."""
    return ours_dpo(steps, warmup, profile, pair_prefix=False)


# ------------------------------------------------------------------------------------------------ TRL side


def _trl_callback(warmup: int, profile: bool) -> Any:
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.cpu: list[float] = []
            self.start_cpu = 0.0
            self.losses: list[float] = []
            self.num_tokens: list[float] = [0.0]
            self.threads = 0
            self.start = 0.0
            self.ends: list[float] = []
            self.profiler = _Profiler(profile)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.threads = _threads()
            if state.global_step == args.max_steps - 1:  # the extra last step, after the timed ones
                self.profiler.start()
            self.start, self.start_cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now, now_cpu = time.perf_counter(), time.process_time()
            self.profiler.stop()
            if warmup < state.global_step < args.max_steps:
                self.times.append(now - self.start)
                self.cpu.append(now_cpu - self.start_cpu)
            if warmup <= state.global_step < args.max_steps:
                self.ends.append(now)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))
                self.num_tokens.append(float(logs["num_tokens"]))

        def result(self, side: str, steps: int) -> Result:
            tokens = [b - a for a, b in zip(self.num_tokens, self.num_tokens[1:])][warmup : warmup + steps]
            losses = self.losses[: warmup + steps]
            e2e = [b - a for a, b in zip(self.ends, self.ends[1:])]
            return Result(
                side,
                self.times,
                tokens,
                losses,
                _rss_mb(),
                self.threads,
                profile=self.profiler.table,
                cpu_s=self.cpu,
                e2e_s=e2e,
            )

    return StepTimer()


def _trl_args(steps: int, warmup: int, pairs: bool) -> dict[str, Any]:
    per_device = MICRO_SEQS // 2 if pairs else MICRO_SEQS  # TRL's DPO batch size counts pairs
    return {
        "output_dir": "/tmp/bench-trl",
        "max_steps": warmup + steps + 1,  # + 1: the profiled step
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": BATCH_SEQS // MICRO_SEQS,
        "train_sampling_strategy": "sequential",
        "activation_checkpointing": _grad_checkpointing(),  # TRL defaults to True, roll to False: same on both
        "bf16": False,  # TRL's configs default to bf16 autocast (on CPU too); both sides train in fp32
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
        "torch_compile": _compiled(),
    }


def trl_sft(steps: int, warmup: int, profile: bool) -> Result:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer  # type: ignore[attr-defined]

    rows, tokenizer = _rows("sft")
    ds = Dataset.from_list([{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows])
    timer = _trl_callback(warmup, profile)
    args = SFTConfig(
        **_trl_args(steps, warmup, pairs=False),
        max_length=None if _best() else MAX_LENGTH,
        padding_free=_best(),
    )
    model = AutoModelForCausalLM.from_pretrained(_model_path(), attn_implementation=_attention())
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=ds, processing_class=tokenizer, callbacks=[timer]
    )
    trainer.train()
    return timer.result("trl sft", steps)  # type: ignore[no-any-return]


def trl_dpo(steps: int, warmup: int, profile: bool) -> Result:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer  # type: ignore[attr-defined]

    rows, tokenizer = _rows("preference")
    ds = Dataset.from_list([{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in rows])
    timer = _trl_callback(warmup, profile)
    args = DPOConfig(
        **_trl_args(steps, warmup, pairs=True), max_length=MAX_LENGTH, beta=0.1, precompute_ref_log_probs=True
    )
    model = AutoModelForCausalLM.from_pretrained(_model_path(), attn_implementation=_attention())
    trainer = DPOTrainer(
        model=model, args=args, train_dataset=ds, processing_class=tokenizer, callbacks=[timer]
    )
    _check_same_tokens(trainer.train_dataset, rows)
    trainer.train()
    return timer.result("trl dpo", steps)  # type: ignore[no-any-return]


def _check_same_tokens(trl_rows: Any, rows: list[dict[str, Any]]) -> None:
    for column in ("prompt_ids", "chosen_ids", "rejected_ids"):
        if list(trl_rows[column]) != [list(r[column]) for r in rows]:
            raise RuntimeError(
                f"TRL tokenized {column} differently from roll: the sides would not do the same work"
            )


def _e2e(mode: Literal["sft", "dpo"], steps: int, warmup: int) -> Result:
    """Our ``sft`` / ``dpo`` pipeline (examples/<mode>.yaml) through one Ray actor, on the same rows, batch and
    micro-batch sizes and LR as the in-process sides; s/step from its ``time/step_s`` (driver and dispatch
    included). No evaluation and no checkpoint inside the timed steps."""
    import tempfile
    from pathlib import Path

    from roll.core.config.loader import load_config
    from roll.pipelines.dpo import SPEC as DPO_SPEC
    from roll.pipelines.sft import SPEC as SFT_SPEC

    out = Path(tempfile.mkdtemp()) / "run"
    kind, per_step = ("sft", BATCH_SEQS) if mode == "sft" else ("preference", BATCH_SEQS // 2)
    source = f"{{path: 'builtin:arithmetic', builtin_kind: {kind}, max_samples: {ROWS}}}"
    overrides = [
        f"output_dir={out}", f"max_steps={steps + warmup}", "eval_every=0", "tracking.progress=false",
        "tracking.backends=[jsonl]", "checkpoint.export_hf=false", "checkpoint.every_n_steps=0",
        f"data.sources=[{source}]", f"batch.prompts_per_step={per_step}", f"batch.micro_batch_samples={MICRO_SEQS}",
        f"actor_train.strategy.optimizer.lr={LR}", "actor_train.strategy.scheduler.kind=constant",
        "actor_train.strategy.scheduler.warmup_steps=0", f"actor_train.strategy.packed={str(_best()).lower()}",
        f"actor_train.strategy.compile={str(_compiled()).lower()}",
        f"actor_train.model.attn_implementation={_attention()}",
        f"actor_train.strategy.gradient_checkpointing={str(_grad_checkpointing()).lower()}",
        "ray.init_timeout_s=300",  # a Ray start on a loaded 2-core box can take minutes
    ]  # fmt: skip
    spec = SFT_SPEC if mode == "sft" else DPO_SPEC
    cfg = load_config(
        Path(__file__).parents[1] / "examples" / f"{mode}.yaml", overrides, model=spec.config_model
    )
    pipeline = spec.build(cfg)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    rows = [json.loads(line)["metrics"] for line in (out / "metrics.jsonl").read_text().splitlines()][warmup:]
    step_s = [r["time/step_s"] for r in rows]
    return Result(
        f"roll {mode} (pipeline)",
        step_s,
        [r["train/tokens"] for r in rows],
        [r["train/loss"] for r in rows],
        _rss_mb(),
        _threads(),
        e2e_s=step_s,
    )


def e2e_sft(steps: int, warmup: int, profile: bool) -> Result:
    return _e2e("sft", steps, warmup)


def e2e_dpo(steps: int, warmup: int, profile: bool) -> Result:
    return _e2e("dpo", steps, warmup)


SIDES: dict[str, Callable[[int, int, bool], Result]] = {
    "ours_sft": ours_sft,
    "trl_sft": trl_sft,
    "ours_dpo": ours_dpo,
    "plain_dpo": plain_dpo,
    "trl_dpo": trl_dpo,
    "e2e_sft": e2e_sft,
    "e2e_dpo": e2e_dpo,
}


# ------------------------------------------------------------------------------------------------ driver


def _run_side(name: str, args: argparse.Namespace, setting: str) -> Result:
    cmd = [sys.executable, __file__, "--side", name, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    cmd += ["--threads", str(args.threads), *(["--profile"] if args.profile else [])]
    env = dict(os.environ, OMP_WAIT_POLICY=args.omp_wait.upper(), TQDM_DISABLE="1")
    env[CHECKPOINTING_ENV] = "1" if args.grad_checkpointing else "0"
    env[SETTING_ENV] = setting
    before = os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-4000:]}")
    fields = json.loads(proc.stdout.strip().splitlines()[-1])
    return Result(**{**fields, "load": [before, os.getloadavg()[0]]})


def _merge(runs: list[Result]) -> Result:
    """Rounds of one side pooled: every timed step, the largest RSS, the load range."""
    first = runs[0]
    return Result(
        first.side,
        [t for r in runs for t in r.step_s],
        [n for r in runs for n in r.tokens],
        first.losses,
        max(r.peak_rss_mb for r in runs),
        first.threads,
        [min(x for r in runs for x in r.load), max(x for r in runs for x in r.load)],
        first.profile,
        [t for r in runs for t in r.cpu_s],
        [t for r in runs for t in r.e2e_s],
    )


def _row(r: Result) -> str:
    tok_step = sum(r.tokens) / len(r.tokens)
    return (
        f"{r.side:<20} {r.s_per_step:>8.4f} {r.best_s:>7.4f} {r.cpu_per_step:>7.4f} {r.tokens_per_s:>9.0f} {tok_step:>8.0f} "
        f"{r.final_loss:>10.4f} {r.peak_rss_mb:>7.0f} {r.threads:>3} {r.load[0]:.1f}-{r.load[1]:.1f}"
    )


def _e2e_line(mode: str, ours: Result, trl: Result) -> str:
    """Real entry points: our pipeline's step time against TRL's whole-loop step interval (medians)."""
    ours_s, trl_s = statistics.median(ours.e2e_s), statistics.median(trl.e2e_s)
    ours_tps = statistics.median(ours.tokens) / ours_s
    trl_tps = statistics.median(trl.tokens) / trl_s
    return (
        f"{mode} entry points (roll pipeline vs TRL Trainer loop): {ours_s:.4f} vs {trl_s:.4f} s/step, "
        f"tokens/s {ours_tps:.0f} vs {trl_tps:.0f} = {ours_tps / trl_tps:.2f}x "
        f"(load {ours.load[0]:.1f}-{ours.load[1]:.1f} vs {trl.load[0]:.1f}-{trl.load[1]:.1f})"
    )


def _table(results: dict[str, Result]) -> str:
    head = (
        f"{'side':<20} {'s/step':>8} {'best s':>7} {'cpu s':>7} {'tokens/s':>9} {'tok/step':>8} {'final loss':>10} "
        f"{'RSS MB':>7} {'thr':>3} load"
    )
    lines = [head, *(_row(r) for r in results.values())]
    for mode in ("sft", "dpo"):
        ours, trl = results.get(f"ours_{mode}"), results.get(f"trl_{mode}")
        if ours and trl:
            diff = max(abs(a - b) for a, b in zip(ours.losses, trl.losses))
            lines.append(
                f"{mode}: roll/TRL tokens/s = {ours.tokens_per_s / trl.tokens_per_s:.2f}x, "
                f"s/step = {ours.s_per_step / trl.s_per_step:.2f}x, "
                f"best step = {trl.best_s / ours.best_s:.2f}x faster, RSS = {ours.peak_rss_mb / trl.peak_rss_mb:.2f}x, "
                f"max |loss diff| over {min(len(ours.losses), len(trl.losses))} steps = {diff:.2e} "
                f"(step 1: {ours.losses[0]:.6f} vs {trl.losses[0]:.6f})"
            )
        plain = results.get(f"plain_{mode}")
        if ours and plain:
            lines.append(
                f"{mode}: pair_prefix on/off: CPU s/step {ours.cpu_per_step:.4f} vs {plain.cpu_per_step:.4f} = "
                f"{plain.cpu_per_step / ours.cpu_per_step:.2f}x less, tokens/s {ours.tokens_per_s / plain.tokens_per_s:.2f}x, "
                f"max |loss diff| {max(abs(a - b) for a, b in zip(ours.losses, plain.losses)):.2e}"
            )
        e2e = results.get(f"e2e_{mode}")
        if e2e and trl and e2e.e2e_s and trl.e2e_s:
            lines.append(_e2e_line(mode, e2e, trl))
    return "\n".join(lines)


SAME_IN_EVERY_SETTING = {("trl", "dpo")}
"""Sides whose ``padding_free`` run is the same work as their ``defaults`` run (TRL's DPO has no padding-free mode).
Picking the faster of two runs of one configuration picks the luckier moment of the box (seen: TRL DPO at 0.254
and 0.192 s/step in the two tables of one run), so the best-vs-best line pools them instead."""

POOLED_SETTINGS = ("defaults", "padding_free")
"""The settings that are one configuration for the sides of :data:`SAME_IN_EVERY_SETTING` (``compiled`` is not)."""


def _candidates(side: str, mode: str, tables: dict[str, dict[str, Result]]) -> list[tuple[str, Result]]:
    """A side's runs by setting; for :data:`SAME_IN_EVERY_SETTING`, its :data:`POOLED_SETTINGS` runs as one."""
    runs = [(name, t[f"{side}_{mode}"]) for name, t in tables.items()]
    same = [r for name, r in runs if name in POOLED_SETTINGS]
    if (side, mode) not in SAME_IN_EVERY_SETTING or len(same) < 2:
        return runs
    return [
        *((n, r) for n, r in runs if n not in POOLED_SETTINGS),
        (" and ".join(POOLED_SETTINGS) + " pooled", _merge(same)),
    ]


def _best_line(mode: str, tables: dict[str, dict[str, Result]]) -> str:
    """Each side's setting with the lower median s/step, and the tokens/s ratio between those two; a side whose
    ``defaults`` and ``padding_free`` are one configuration (:data:`SAME_IN_EVERY_SETTING`) has those pooled."""
    picks = {
        side: min(_candidates(side, mode, tables), key=lambda x: x[1].s_per_step) for side in ("ours", "trl")
    }
    (ours_set, ours), (trl_set, trl) = picks["ours"], picks["trl"]
    return (
        f"{mode}: roll ({ours_set}) {ours.tokens_per_s:.0f} tokens/s vs TRL ({trl_set}) {trl.tokens_per_s:.0f} = "
        f"{ours.tokens_per_s / trl.tokens_per_s:.2f}x, s/step {ours.s_per_step:.4f} vs {trl.s_per_step:.4f}, "
        f"CPU s/step {ours.cpu_per_step:.4f} vs {trl.cpu_per_step:.4f} = {trl.cpu_per_step / ours.cpu_per_step:.2f}x "
        f"(load {ours.load[0]:.1f}-{ours.load[1]:.1f} vs {trl.load[0]:.1f}-{trl.load[1]:.1f})"
    )


def _compare(args: argparse.Namespace, names: list[str], setting: str) -> dict[str, Result]:
    """Every side ``args.rounds`` times, in alternating order (reversed in odd rounds)."""
    runs: dict[str, list[Result]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            runs[name].append(_run_side(name, args, setting))
    return {name: _merge(rs) for name, rs in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="alternate the sides this many times")
    parser.add_argument("--omp-wait", choices=["passive", "active"], default="passive")
    parser.add_argument("--profile", action="store_true", help="print the top ops of one step per side")
    parser.add_argument(
        "--grad-checkpointing", action="store_true", help="recompute activations on both sides"
    )
    parser.add_argument(
        "--settings",
        default="defaults,padding_free",
        help="comma-separated tables to run: defaults (padded on both sides), padding_free (on both sides), "
        "compiled (torch.compile on both sides), compiled_eager_attention (and transformers' eager attention)",
    )
    parser.add_argument("--modes", default="sft,dpo", help="comma-separated: sft, dpo")
    parser.add_argument(
        "--e2e", action="store_true", help="also time our sft/dpo pipelines through a Ray actor"
    )
    parser.add_argument(
        "--ab",
        action="store_true",
        help="also run our DPO step without pair_prefix (before/after, interleaved)",
    )
    parser.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        _setup(args.threads)
        print(json.dumps(asdict(SIDES[args.side](args.steps, args.warmup, args.profile))))
        return
    modes = args.modes.split(",")
    extra = [*(["e2e"] if args.e2e else []), *(["plain"] if args.ab else [])]
    names = [f"{side}_{m}" for m in modes for side in ("ours", "trl", *extra) if f"{side}_{m}" in SIDES]
    print(
        f"load average at start: {os.getloadavg()}, cores: {os.cpu_count()}, OMP_WAIT_POLICY={args.omp_wait}"
    )
    tables: dict[str, dict[str, Result]] = {}
    unknown = set(args.settings.split(",")) - set(SETTINGS)
    if unknown:
        parser.error(f"--settings: unknown {sorted(unknown)}; known: {', '.join(SETTINGS)}")
    for setting in args.settings.split(","):
        tables[setting] = results = _compare(args, names, setting)
        print(f"\n== {setting} vs {setting} ==\n{_table(results)}")
        if args.profile:
            for r in results.values():
                print(f"\n{r.side}: top ops of one step (self CPU)\n{r.profile}")
    if len(tables) > 1:
        print("\n== best vs best (each side's faster setting) ==")
        for mode in modes:
            print(_best_line(mode, tables))


if __name__ == "__main__":
    main()
