"""The ``reward_model`` reward: a sequence-classification folder scores (prompt, response) conversations.

A random tiny Qwen2 classifier with roll's offline tokenizer is saved to a folder the test writes; scores must equal
the head read at the last token of each conversation scored alone (so padding in a batch changes nothing), and
``scale``/``shift`` apply. About 2 s after transformers is imported.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from roll.core import plugins
from roll.data.tokenizer import build_tokenizer
from roll.pipelines.rewards.config import RewardModelRewardConfig
from roll.pipelines.rewards.types import RewardRequest


@pytest.fixture(scope="module")
def rm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    tokenizer = build_tokenizer("roll-tiny")
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
    )
    folder = tmp_path_factory.mktemp("rm")
    Qwen2ForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


REQUESTS = [
    RewardRequest("The answer is 7.", prompt="What is 3+4?"),
    RewardRequest("I do not know, sorry, really not.", prompt="What is 3+4?"),
    RewardRequest("8", prompt="What is 5+3? Think."),
]


def test_scores_match_one_by_one_and_scale(rm_folder: Path) -> None:
    spec = plugins.load("roll.reward", "reward_model")
    reward = spec.build(RewardModelRewardConfig(path=str(rm_folder), batch_size=3))
    batched = [r.score for r in reward.score(REQUESTS)]
    alone = [reward.raw_scores([reward.text_of(r)])[0] for r in REQUESTS]
    torch.testing.assert_close(torch.tensor(batched), torch.tensor(alone), atol=1e-5, rtol=1e-5)
    assert len(set(round(s, 4) for s in batched)) == 3  # different conversations, different scores
    text = reward.text_of(REQUESTS[0])
    assert "What is 3+4?" in text and "The answer is 7." in text  # the chat-templated conversation
    scaled = spec.build(
        RewardModelRewardConfig(path=str(rm_folder), scale=2.0, shift=-1.0, correct_above=0.0)
    )
    results = scaled.score(REQUESTS)
    torch.testing.assert_close(
        torch.tensor([r.score for r in results]), 2 * torch.tensor(batched) - 1, atol=1e-5, rtol=1e-5
    )
    assert [r.info["correct"] for r in results] == [r.score > 0 for r in results]
