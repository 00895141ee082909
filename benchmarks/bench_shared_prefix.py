"""The shared-prefix training forward against the plain one: one fsdp2 GRPO-shaped train step, in one process.

The step is the quickstart's: tiny-1m, 32 prompts x 8 samples (one-digit-sum prompts through the tiny chat
template), responses of 1..12 random tokens, micro-batches of 128 rows, the loss on the response tokens only
(``score_mask``), AdamW. Both sides run the same batches; ``max |loss diff|`` shows they compute the same loss.
Each side's step is timed by wall clock and by the process's CPU time (``time.process_time``): on a shared box
the CPU time moves less with the other processes than the wall time does, though both inflate. Sides alternate
step by step. ``positions`` is the token positions the model embeds per step (the work the sharing removes), ``work`` the
shared side's positions over the plain side's.

``--samples 2,4,8`` sweeps the group size G (the rows per distinct prompt; DPO's pairs are G=2): the sharing
saves less as G falls, and below some ``work`` its two forwards cost more than the one plain forward. The
forward's gate (``shared_prefix.MAX_WORK_FRACTION``) is lifted here so both sides run at every G; the sweep is
where that gate's value comes from.

    uv run python benchmarks/bench_shared_prefix.py [--steps 8 --threads 2 --samples 2,4,8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def grpo_batch(tokenizer: object, seed: int, prompts: int = 32, samples: int = 8) -> dict[str, torch.Tensor]:
    from roll.core import columns as C
    from roll.core.batch import Batch
    from roll.data.sequences import to_sequences
    from roll.data.tasks import builtin_dataset

    g = torch.Generator().manual_seed(seed)
    rows = builtin_dataset("arithmetic", "rl", prompts, options={"level": 0}, seed=seed)
    prompt_ids, response_ids = [], []
    for r in rows:
        prompt = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            r["messages"], tokenize=True, add_generation_prompt=True, return_dict=False
        )
        for _ in range(samples):
            n = int(torch.randint(1, 13, (), generator=g))
            prompt_ids.append(list(prompt))
            response_ids.append(torch.randint(10, len(tokenizer), (n,), generator=g).tolist())  # type: ignore[arg-type]
    logps = [[0.0] * len(r) for r in response_ids]
    columns = {C.PROMPT_IDS: prompt_ids, C.RESPONSE_IDS: response_ids, C.RESPONSE_LOGP: logps}
    batch = to_sequences(Batch(non_tensors=columns), pad_token_id=0)  # the pipelines' own row layout
    return {
        "input_ids": batch[C.INPUT_IDS],
        "attention_mask": batch[C.ATTENTION_MASK],
        "loss_mask": batch[C.RESPONSE_MASK],
    }


class ResponseNLL:
    """Summed NLL of the response tokens, read only there (``score_mask``), like the RL losses."""

    needs_entropy = False

    def __call__(self, output, micro_batch):  # type: ignore[no-untyped-def]
        return -(output.logp_BT * micro_batch["loss_mask"]).sum(), {}

    def count_units(self, micro_batch) -> float:  # type: ignore[no-untyped-def]
        return float(micro_batch["loss_mask"].sum())

    def score_mask(self, micro_batch):  # type: ignore[no-untyped-def]
        return micro_batch["loss_mask"].bool()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--samples", default="8", help="comma-separated group sizes G to sweep")
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll.data.models import resolve_model_path
    from roll.workers import shared_prefix

    shared_prefix.MAX_WORK_FRACTION = 1.0  # measure both sides at every G, past the gate
    path = resolve_model_path("tiny-1m")
    tok = AutoTokenizer.from_pretrained(path)
    print(f"load average: {os.getloadavg()[0]:.2f}, threads {args.threads}, steps {args.steps}")
    print("| G | forward | positions/step | work | wall s/step (median) | CPU s/step (median) |")
    print("|---|---|---|---|---|---|")
    for samples in [int(g) for g in args.samples.split(",")]:
        _compare(AutoModelForCausalLM, path, tok, samples, args.steps)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


def _compare(model_cls: type, path: str, tok: object, samples: int, steps: int) -> None:
    """Both sides on the same batches of groups of ``samples``; prints their rows and the ratio line."""
    from roll.workers.config import FSDP2Config
    from roll.workers.fsdp2 import FSDP2TrainStrategy

    sides = {}
    for shared in (False, True):
        torch.manual_seed(0)
        model = model_cls.from_pretrained(path, dtype=torch.float32)  # type: ignore[attr-defined]
        cfg = FSDP2Config(device="cpu", micro_batch_size=128, shared_prefix=shared)
        strategy = FSDP2TrainStrategy(model, cfg)
        seen: list[int] = []
        model.get_input_embeddings().register_forward_hook(
            lambda m, a, o, seen=seen: seen.append(a[0].numel())
        )
        sides[shared] = (strategy, seen, {"wall": [], "cpu": [], "loss": []})
    batches = [grpo_batch(tok, seed=s, samples=samples) for s in range(steps + 1)]  # 32 prompts x G
    for step, batch in enumerate(batches):
        for strategy, seen, out in sides.values():
            seen.clear()
            wall, cpu = time.perf_counter(), time.process_time()
            loss = strategy.train_step(batch, ResponseNLL()).loss
            if step:  # the first step warms up allocators and kernels
                out["wall"].append(time.perf_counter() - wall)
                out["cpu"].append(time.process_time() - cpu)
            out["loss"].append(loss)
    positions = {shared: sum(seen) for shared, (_, seen, _) in sides.items()}
    for shared, (_, _seen, out) in sides.items():
        name = "shared prefix" if shared else "plain"
        wall, cpu = statistics.median(out["wall"]), statistics.median(out["cpu"])
        work = positions[shared] / positions[False]
        print(f"| {samples} | {name} | {positions[shared]} | {work:.2f} | {wall:.3f} | {cpu:.3f} |")
    plain, shared_ = sides[False][2], sides[True][2]
    diff = max(abs(a - b) for a, b in zip(plain["loss"], shared_["loss"], strict=True))
    ratio = statistics.median(plain["cpu"]) / statistics.median(shared_["cpu"])
    wall_ratio = statistics.median(plain["wall"]) / statistics.median(shared_["wall"])
    print(f"| {samples} | plain / shared | | | {wall_ratio:.2f}x | {ratio:.2f}x (max loss diff {diff:.1e}) |")


if __name__ == "__main__":
    main()
