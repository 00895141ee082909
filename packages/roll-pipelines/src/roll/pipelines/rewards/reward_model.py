"""A trained reward model as an RLVR reward: ``type: reward_model, options: {path: outputs/rm/hf}``.

Each response is scored as the conversation ``[user: prompt, assistant: response]`` rendered by the chat
template (``template``, else the tokenizer's own), which is how roll's ``reward_model`` pipeline renders the
pairs it trains on; without any chat template the text is ``prompt + response``. The score is
``scale * head(last token) + shift``, read at each row's last attended token (the same rule as training, see
:func:`roll.workers.roles.heads.score_forward`), in batches of ``batch_size``. The model loads in the reward
worker's ``build``, once; ``device: auto`` takes CUDA when the worker was given a GPU.
"""

from __future__ import annotations

from typing import Any

import torch

from roll.data.templates import render
from roll.pipelines.rewards._hf import encoded_batches, load_tokenizer, pick_device
from roll.pipelines.rewards.config import RewardModelRewardConfig
from roll.pipelines.rewards.types import RewardRequest, RewardResult
from roll.workers.roles.heads import score_forward


class RewardModelReward:
    """Scores with ``AutoModelForSequenceClassification.from_pretrained(config.path)`` (one label)."""

    def __init__(self, config: RewardModelRewardConfig) -> None:
        from transformers import AutoModelForSequenceClassification

        from roll.data.models import resolve_model_path

        self.config = config
        path = resolve_model_path(config.path)
        self.tokenizer = load_tokenizer(path, truncation_side="left")  # keep the response and its last token
        self.device = pick_device(config.device)
        model: Any = AutoModelForSequenceClassification.from_pretrained(path)
        self.model = model.to(self.device).eval()

    def text_of(self, request: RewardRequest) -> str:
        """The text the model scores (module docstring)."""
        has_template = self.config.template is not None or getattr(self.tokenizer, "chat_template", None)
        if not has_template:
            return request.prompt + request.response
        messages = [
            {"role": "user", "content": request.prompt},
            {"role": "assistant", "content": request.response},
        ]
        return render(
            messages, template=self.config.template, tokenizer=self.tokenizer, add_generation_prompt=False
        )

    @torch.no_grad()
    def raw_scores(self, texts: list[str]) -> list[float]:
        """The head's output at each text's last token, batch by batch."""
        out: list[float] = []
        c = self.config
        for enc in encoded_batches(
            self.tokenizer, texts, batch_size=c.batch_size, max_length=c.max_length, device=self.device
        ):
            scores_B = score_forward(self.model, enc["input_ids"], enc["attention_mask"], False, 1.0).scores_B
            if scores_B is None:  # score_forward always sets it; the type says Optional
                raise RuntimeError("score_forward returned no scores")
            out += scores_B.tolist()
        return out

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        raw = self.raw_scores([self.text_of(r) for r in requests])
        results = []
        for value in raw:
            score = self.config.scale * value + self.config.shift
            info: dict[str, Any] = {"raw_score": value}
            if self.config.correct_above is not None:
                info["correct"] = score > self.config.correct_above
            results.append(RewardResult(score, info))
        return results
