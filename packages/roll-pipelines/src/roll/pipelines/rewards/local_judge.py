"""``llm_judge_local``: the ``llm_judge`` reward with a judge model the run serves itself.

The judge loads with ``AutoModelForCausalLM`` in each reward worker of the domain (so the domain's ``workers``
section places it, GPUs included) and answers each filled ``prompt_template`` as a one-turn chat (the tokenizer's
chat template when it has one, else the bare prompt), greedily, in batches of ``batch_size`` left-padded prompts;
the reply is parsed by :func:`roll.pipelines.rewards.judge.parse_judge_score`. A reply with no score scores 0 with
``info["error"]`` and the reply's tail in ``info["judge_reply"]``.
"""

from __future__ import annotations

from typing import Any

import torch

from roll.pipelines.rewards._hf import encoded_batches, load_tokenizer, pick_device
from roll.pipelines.rewards.config import LocalJudgeRewardConfig
from roll.pipelines.rewards.judge import parse_judge_score
from roll.pipelines.rewards.types import RewardRequest, RewardResult


class LocalJudgeReward:
    """Greedy replies of a local causal LM, scored like ``llm_judge``."""

    def __init__(self, config: LocalJudgeRewardConfig) -> None:
        from transformers import AutoModelForCausalLM

        from roll.data.models import resolve_model_path

        self.config = config
        path = resolve_model_path(config.model)
        self.tokenizer = load_tokenizer(path, padding_side="left")
        self.device = pick_device(config.device)
        model: Any = AutoModelForCausalLM.from_pretrained(path)
        self.model = model.to(self.device).eval()

    def judge_prompt(self, request: RewardRequest) -> str:
        """The text the judge continues: the filled template, chat-rendered when the tokenizer has a template."""
        c = self.config
        text = c.prompt_template.format(
            question=request.prompt,
            reference=request.ground_truth,
            response=request.response,
            max_score=c.max_score,
        )
        if not getattr(self.tokenizer, "chat_template", None):
            return text
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return str(rendered)

    @torch.no_grad()
    def replies(self, prompts: list[str]) -> list[str]:
        """Greedy replies, batch by batch (left padding, so every reply starts at the same column)."""
        out: list[str] = []
        c = self.config
        for enc in encoded_batches(
            self.tokenizer,
            prompts,
            batch_size=c.batch_size,
            max_length=c.max_prompt_tokens,
            device=self.device,
        ):
            ids_BT = self.model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=self.config.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
            )
            new_BT = ids_BT[:, enc["input_ids"].shape[1] :]
            out += self.tokenizer.batch_decode(new_BT, skip_special_tokens=True)
        return out

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        c = self.config
        results = []
        for reply in self.replies([self.judge_prompt(r) for r in requests]):
            value = parse_judge_score(reply, c.score_mode, c.max_score)
            if value is None:
                results.append(RewardResult.failed("no score in judge reply", judge_reply=reply[-500:]))
            else:
                results.append(RewardResult(value, {"judge_score": value, "judge_reply": reply[-500:]}))
        return results
