"""Can a policy learn the lookup task's reading turn? A cheap probe to run before spending RL time on it.

    uv run python scripts/lookup_copy_probe.py --lr 1e-3 --tail 24 --steps 100   # tiny-1m: 10/10 by step 75
    uv run python scripts/lookup_copy_probe.py --lr 1e-2 --tail 24 --steps 300   # tiny-1m: 1/10 (chance) throughout

The lookup task (:mod:`roll.agentic.gateway.lookup`) rewards an answer only when the policy copies the digit out of
the ``<tool_response>`` block into its second answer. This script trains that turn alone, in process (plain
AdamW on the summed NLL of the answer tokens, token mean, batches of reading conversations rendered exactly as
the gateway renders them, :func:`~roll.agentic.pipeline.agent_gateway.pipeline.conversation_sample`), and every
``--every`` steps prints the greedy copy accuracy over the ten digits (chance: 1 of 10).

``--tail N`` makes every other row only its last N tokens (the tool response and the answer, without the
system/user/call prefix): a shorter context, a curriculum for the copy.

``--mixed COUNT`` trains the example's warm-up instead, the conversations
``warmup_conversations(COUNT, Random(0), tool_fraction=--tool-fraction, show_tools=False,
reading_fraction=--reading-fraction)`` drawn 32 at a time as the pipeline draws them, and also prints the first
answer's tool-call probability, the copy's mean probability of the right digit, and the success they predict
when sampling (``p_tool * p_copy + (1 - p_tool) / 10``)::

    uv run python scripts/lookup_copy_probe.py --mixed 128 --reading-fraction 0.9 --every 50   # 10/10, 0.97

Simplifications, on purpose: one torch thread, no Ray, no gateway server (the rendering is the gateway's own);
the probe answers "can it copy", not "does RL raise success".
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace
from typing import Any

CALL = {"id": "c", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}


def reading(digit: str) -> dict[str, Any]:
    """A conversation whose last answer copies the tool's result (the reading turn)."""
    from roll.agentic.gateway.lookup import QUESTION, SYSTEM

    return {"messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c", "content": digit}, {"role": "assistant", "content": digit},
    ]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="tiny-1m", help="a tiny-kit name (tiny-1m, tiny-10m) or a local path"
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--tail", type=int, default=0, help="every other row cut to its last N tokens (0: none)"
    )
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument(
        "--mixed",
        type=int,
        default=0,
        help="train the mixed warm-up of this many conversations (0: reading only)",
    )
    parser.add_argument("--tool-fraction", type=float, default=0.3)
    parser.add_argument("--reading-fraction", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll.agentic.env_manager.batching import to_batch
    from roll.agentic.env_manager.chat import ChatEncoder
    from roll.agentic.gateway.lookup import warmup_conversations
    from roll.agentic.pipeline.agent_gateway.pipeline import conversation_sample
    from roll.core import columns as C
    from roll.data.models import resolve_model_path

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    path = resolve_model_path(args.model)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    encoder = ChatEncoder(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    rng, start = random.Random(args.seed), time.monotonic()
    mixed = [conversation_sample(encoder, c) for c in warmup_conversations(
        args.mixed, random.Random(0), tool_fraction=args.tool_fraction, show_tools=False,
        reading_fraction=args.reading_fraction)]  # fmt: skip
    for step in range(args.steps + 1):
        if step % args.every == 0 or step == args.steps:
            extra = ""
            if mixed:
                p_tool, p_copy = tool_probability(model, encoder), copy_probability(model, encoder)
                extra = f"  p_tool {p_tool:.2f}  p_copy {p_copy:.2f}  success {p_tool * p_copy + (1 - p_tool) / 10:.2f}"
            print(f"step {step:4d}  copy {copy_accuracy(model, encoder):2d}/10{extra}  "
                  f"{time.monotonic() - start:6.0f} s", flush=True)  # fmt: skip
        if step == args.steps:
            break
        if mixed:
            rows = rng.choices(mixed, k=args.batch)
        else:
            rows = [conversation_sample(encoder, reading(str(rng.randrange(10)))) for _ in range(args.batch)]
        if args.tail:
            cut = slice(-args.tail, None)
            rows = [replace(r, input_ids=r.input_ids[cut], loss_mask=r.loss_mask[cut], logp=r.logp[cut])
                    if i % 2 == 0 else r for i, r in enumerate(rows)]  # fmt: skip
        batch = to_batch(rows, encoder.pad_token_id)
        ids_BT, mask_BT = batch.tensors[C.INPUT_IDS], batch.tensors[C.RESPONSE_MASK][:, 1:].float()
        logits_BTV = model(input_ids=ids_BT, attention_mask=batch.tensors[C.ATTENTION_MASK]).logits.float()
        logp_BT = torch.log_softmax(logits_BTV[:, :-1], -1).gather(-1, ids_BT[:, 1:, None]).squeeze(-1)
        loss = -(logp_BT * mask_BT).sum() / mask_BT.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return 0


def copy_accuracy(model: Any, encoder: Any) -> int:
    """How many of the ten digits the greedy answer after their tool response copies."""
    import torch

    from roll.agentic.pipeline.agent_gateway.pipeline import conversation_sample

    model.eval()
    right = 0
    with torch.no_grad():
        for digit in range(10):
            row = conversation_sample(encoder, reading(str(digit)))
            prompt = row.input_ids[: row.loss_mask.index(1)]
            logits_V = model(input_ids=torch.tensor([prompt])).logits[0, -1]
            right += encoder.decode([int(logits_V.argmax())]) == str(digit)
    model.train()
    return right


def _next_token_probs(model: Any, encoder: Any, conversation: dict[str, Any]) -> Any:
    """The model's next-token distribution where the conversation's last answer starts."""
    import torch

    from roll.agentic.pipeline.agent_gateway.pipeline import conversation_sample

    row = conversation_sample(encoder, conversation)
    with torch.no_grad():
        logits_V = model(input_ids=torch.tensor([row.input_ids[: row.loss_mask.index(1)]])).logits[0, -1]
    return torch.softmax(logits_V.float(), -1)


def tool_probability(model: Any, encoder: Any) -> float:
    """The probability that the first answer starts with the tool call (its first token)."""
    from roll.agentic.gateway.lookup import CALL_TEXT, QUESTION, SYSTEM

    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION},
             {"role": "assistant", "content": "0"}]  # fmt: skip
    return float(_next_token_probs(model, encoder, {"messages": first})[encoder.encode(CALL_TEXT)[0]])


def copy_probability(model: Any, encoder: Any) -> float:
    """The mean probability, over the ten digits, of the right digit after its tool response."""
    probs = [_next_token_probs(model, encoder, reading(str(d)))[encoder.encode(str(d))[0]] for d in range(10)]
    return float(sum(probs)) / 10


if __name__ == "__main__":
    raise SystemExit(main())
