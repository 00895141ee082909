"""Figures for tests/gpu/run.sh's rlvr line: the GPU's bf16 peak, the model, and the run's step time, tokens/s, MFU.

    python tests/gpu/perf.py peak OUT.json          bf16 matmul peak of this GPU, measured now (torch.cuda)
    python tests/gpu/perf.py rlvr PEAK.json OUT_DIR  the quickstart's rlvr pipeline on CUDA with the Qwen2 below,
                                                     then its figures (s/step, tokens/s, MFU against PEAK.json)

MFU (model FLOPs utilization) per RL step = 8 * N * T / step_s / peak, with N the model's parameters (the tied
embedding once) and T the step's tokens (prompts and responses): generation reads each token once through the KV
cache (2 N T) and training runs forward and backward over them (6 N T); attention's own term is left out (its share
is under 2% at these ~40-token rows) and so is the one-prompt sync check. The first RL step (allocator and kernel
warm-up) is left out of the means. ``peak`` is not the datasheet's: it is an 8192^3 bf16 matmul timed with CUDA
events on this GPU in this run, so MFU is measured against what the chip delivers to torch here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

PRESET = {
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "intermediate_size": 4096,
}
"""~0.36B parameters: Qwen2-0.5B's depth and a 1024 width, with the offline tokenizer's 512-token vocabulary."""


def peak(out: Path, n: int = 8192, warmup: int = 3, reps: int = 20) -> None:
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(warmup):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / reps
    tflops = 2 * n**3 / seconds / 1e12
    out.write_text(json.dumps({"bf16_tflops": tflops, "gpu": torch.cuda.get_device_name()}))
    print(f"FIGURES: {torch.cuda.get_device_name()}: bf16 {n}^3 matmul {tflops:.0f} TFLOP/s (mean of {reps})")


RLVR_OVERRIDES = [
    "max_steps=6", "eval_every=0", "warmup.steps=20", "warmup.lr=1e-4", "ray.num_cpus=8", "ray.num_gpus=1",
    "actor_train.gpus_per_worker=1", "actor_train.strategy.optimizer.lr=1e-5", "batch.prompts_per_step=128",
    "rollout.request_prompts=128", "batch.micro_batch_samples=256", "actor_infer.strategy.generation_batch_size=1024",
    "failures.max_steps_without_update=0", "tracking.backends=[jsonl]",
]  # fmt: skip
"""examples/quickstart.yaml (placement hybrid: hf generator and fsdp2 trainer in one actor; bf16 on CUDA by both
strategies' ``auto``) with a 1024-row batch (128 prompts x 8) that gives the GPU some work, a gentle learning rate for
the larger model, and no stop when a step's groups all score alike (a random 0.36B model may learn nothing in 6)."""


def model() -> tuple[Path, int]:
    """The check's Qwen2 folder (built once from :data:`PRESET`, cached) and its parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from roll.data.tiny import TinyPreset, tiny_model_path

    path = tiny_model_path(TinyPreset(**PRESET))
    with torch.device("meta"):
        params = sum(
            p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).parameters()
        )
    print(f"Qwen2 from a config: {params / 1e6:.0f}M parameters, at {path}", flush=True)
    return path, params


def rlvr(peak_file: Path, out_dir: Path) -> None:
    path, params = model()
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "roll.core.cli", "train", "examples/quickstart.yaml", *RLVR_OVERRIDES,
           f"actor_train.model.path={path}", f"output_dir={out_dir}"]  # fmt: skip
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    report(out_dir / "metrics.jsonl", json.loads(peak_file.read_text())["bf16_tflops"], params)


def report(metrics: Path, tflops: float, params: int) -> None:
    rows = [json.loads(line)["metrics"] for line in metrics.read_text().splitlines()]
    steps = [r for r in rows if "policy_version" in r]
    if len(steps) < 2:
        sys.exit(f"{len(steps)} RL steps in {metrics}; need 2 or more")
    table = []
    for i, r in enumerate(steps, start=1):
        tokens = r["throughput/train_tokens_per_s"] * r["time/train_s"]
        gen = r["throughput/generate_tokens_per_s"] * r["time/generate_s"]
        mfu = 8 * params * tokens / r["time/step_s"] / (tflops * 1e12)
        table.append((r["time/step_s"], tokens / r["time/step_s"], gen / r["time/generate_s"], mfu))
        print(f"RL step {i} (policy version {int(r['policy_version'])}): {r['time/step_s']:.2f} s, {tokens:.0f} tokens ({gen:.0f} generated), "
              f"generate {r['time/generate_s']:.2f} s, train {r['time/train_s']:.2f} s, MFU {mfu:.1%}")  # fmt: skip
    steady = table[1:]
    step_s, tok_s, gen_s, mfu = (sum(col) / len(steady) for col in zip(*steady, strict=True))
    print(
        f"FIGURES: {step_s:.2f} s/step, {tok_s:.0f} tokens/s ({gen_s:.0f} generated tokens/s in generate), "
        f"MFU {mfu:.1%} of {tflops:.0f} TFLOP/s ({params / 1e6:.0f}M params, mean of steps 2-{len(steps)})"
    )


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"peak": peak, "rlvr": rlvr}[command](*map(Path, args))
