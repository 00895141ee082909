"""Small batches: roll's rlvr pipeline vs TRL's ``GRPOTrainer`` at 64 completions of a few tokens per step.

At this size a step's model work is small, so the fixed cost of a step (roll: Ray round trips, the reward's
scoring, metrics, the weight sync; TRL: its generate/score/train loop in one process) is most of the step.

Nothing here comes from roll's tiny-model kit: the start model is built with plain ``transformers`` and
``tokenizers`` (a character-level tokenizer with a ChatML template, a ~0.8M-parameter ``Qwen2ForCausalLM`` from
``Qwen2Config``, seed 0), the task is its own (echo three letters: the user says ``abc``, the answer is ``abc``,
three tokens and ``<|im_end|>``), and the model is warmed on that task by TRL's ``SFTTrainer`` (completion-only
loss), once per run, saved to a temp folder both sides load. The reward is a plain Python function (exact match,
in this file): TRL calls it as its reward callable, roll as a ``type: python`` reward (``docs/rewards.md``).

Same on both sides (as in ``bench_grpo_vs_trl.py``, whose helpers run both sides here): ``P`` prompts x ``G``
completions per step (8 x 8), at most 16 new tokens, temperature 1, token-mean loss (TRL ``loss_type="dapo"``),
no KL, one optimizer step per generation batch, AdamW at the same lr, grad clip 1.0, fp32, seed 0, the same torch
thread count, ``OMP_WAIT_POLICY=PASSIVE``. Sides alternate over ``--rounds`` (roll first in odd rounds); the
table gives median s/step over the steps after each run's first, the load (1-minute average, min-max) seen while
each side ran, and the completion length and hit-max share at step 1 (the same-work check: both sample from the
same start model).

Run: ``uv run python benchmarks/bench_small_batch_vs_trl.py [--steps 20] [--rounds 2] [--roll-set KEY=VALUE]``
(about 5 minutes on a quiet 2-core box with the defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_grpo_vs_trl import alternate, print_table, roll_rlvr, trl_grpo

LETTERS = string.ascii_lowercase[:12]  # a-l: 1320 three-letter words of distinct letters
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def echo_reward(response: str, ground_truth: str, **_: object) -> dict[str, object]:
    """1.0 when the answer is exactly the word asked (surrounding whitespace aside), else 0.0."""
    correct = response.strip() == ground_truth
    return {"score": float(correct), "correct": correct}


def trl_reward(completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
    """:func:`echo_reward` as TRL's reward callable (conversational completions)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(echo_reward(t, g)["score"]) for t, g in zip(texts, ground_truth)]  # type: ignore[arg-type]


def words(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.sample(LETTERS, 3)) for _ in range(n)]


def build_model(folder: Path) -> None:
    """A character-level tokenizer (``tokenizers``) and a ~0.8M-parameter Qwen2 (``transformers``), saved."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    # byte-level symbols, no merges: one token per character. AutoTokenizer loads a folder whose config says
    # qwen2 as Qwen2Tokenizer, which keeps only the vocab and merges and rebuilds a byte-level pipeline around
    # them, so the vocab names space and newline as byte-level does ("Ġ", "Ċ") and both pipelines agree.
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    chars = [*string.ascii_lowercase, "Ġ", "Ċ"]
    vocab = {t: i for i, t in enumerate(specials + chars + ["<unk>"])}
    raw = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<unk>",
        chat_template=TEMPLATE, padding_side="left",
    )  # fmt: skip
    tok.add_special_tokens({"additional_special_tokens": specials[1:]})
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(vocab), hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True,
        bos_token_id=vocab["<|im_start|>"], eos_token_id=vocab["<|im_end|>"], pad_token_id=vocab["<|endoftext|>"],
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = vocab["<|im_end|>"]
    model.generation_config.pad_token_id = vocab["<|endoftext|>"]
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    print(
        f"start model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, vocab {len(vocab)}"
    )


def sft_warm(folder: Path, steps: int, threads: int) -> None:
    """TRL's ``SFTTrainer`` on the task (loss on the completion only), saved back into ``folder``."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    rows = [
        {
            "prompt": [{"role": "user", "content": w}],
            "completion": [{"role": "assistant", "content": w}],
        }
        for w in words(512, seed=1)
    ]
    cfg = SFTConfig(
        output_dir=str(folder / "sft"), max_steps=steps, per_device_train_batch_size=32, learning_rate=3e-3,
        lr_scheduler_type="constant", logging_steps=max(1, steps // 4), report_to="none", use_cpu=True,
        bf16=False, save_strategy="no", seed=0, completion_only_loss=True, dataloader_num_workers=0,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder)
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(rows), processing_class=tok)
    trainer.train()
    trainer.model.save_pretrained(folder)
    tok.save_pretrained(folder)


def rl_rows(n: int = 256) -> list[dict[str, str]]:
    return [{"prompt": w, "ground_truth": w} for w in words(n, seed=2)]


def trl_main(args: argparse.Namespace) -> None:
    rows = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in rl_rows()]
    trl_grpo(args, rows, trl_reward)


def roll_main(args: argparse.Namespace) -> None:
    data = args.out / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rl_rows()))
    yaml = args.out / "small.yaml"
    yaml.write_text(ROLL_YAML)
    overrides = [
        f"output_dir={args.out / 'roll'}", f"max_steps={args.steps}", f"seed={args.seed}",
        f"actor_train.model.path={args.model}", f"data.sources.0.path={data}",
        f"batch.prompts_per_step={args.P}", f"batch.samples_per_prompt={args.G}",
        f"batch.micro_batch_samples={args.P * args.G}", f"rollout.request_prompts={args.P}",
        f"rollout.max_new_tokens={args.max_new_tokens}", f"actor_train.strategy.optimizer.lr={args.lr}",
        f"cpu_threads={args.threads}", f"rewards.echo.options.function={Path(__file__).resolve()}:echo_reward",
        *args.roll_set,
    ]  # fmt: skip
    roll_rlvr(yaml, overrides)


ROLL_YAML = """\
pipeline: rlvr
seed: 0
output_dir: unset
max_steps: 20
eval_every: 0
plot: false
ray: {num_cpus: 2, init_timeout_s: 300}
cpu_threads: 2
placement: hybrid
actor_train:
  num_workers: 1
  cpus_per_worker: 0.5
  model: {path: unset}
  strategy: {type: fsdp2, optimizer: {lr: 5.0e-4}, max_grad_norm: 1.0}
actor_infer: {cpus_per_worker: 0.5}
batch: {prompts_per_step: 8, samples_per_prompt: 8, micro_batch_samples: 64}
rollout: {max_new_tokens: 16, temperature: 1.0, request_prompts: 8}
algorithm: {preset: grpo, kl_mode: none, kl_coef: 0.0, loss_agg_mode: token-mean}
data:
  sources:
    - {path: unset, builtin_kind: rl}
rewards:
  echo:
    type: python
    workers: {num_workers: 1, cpus_per_worker: 0.25}
    options: {function: unset}
tracking: {backends: [jsonl], progress: false}
failures: {max_steps_without_update: 0}
"""


def compare(args: argparse.Namespace) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # the warm-up trains in this process
    out = Path(tempfile.mkdtemp(prefix="bench_small_"))
    model = out / "start-model"
    build_model(model)
    sft_warm(model, args.warmup_steps, args.threads)
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
            ("lr", args.lr), ("threads", args.threads), ("seed", args.seed),
        )
    ]  # fmt: skip
    flags += [f"--roll-set={kv}" for kv in args.roll_set]
    print_table(alternate(Path(__file__), model, out, flags, env, args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--P", type=int, default=8)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup-steps", type=int, default=200, help="TRL SFT steps (batch 32) on the task")
    parser.add_argument("--rounds", type=int, default=2, help="alternate the sides this many times")
    parser.add_argument("--roll-set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--side", choices=["trl", "roll"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "trl":
        return trl_main(args)
    if args.side == "roll":
        return roll_main(args)
    compare(args)


if __name__ == "__main__":
    main()
