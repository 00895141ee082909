"""``llm_judge_local``: an LLM judge the run serves itself (here the tiny-1m preset, untrained).

Its replies must be exactly the model's greedy continuation of each judge prompt (batched with left padding =
one by one = ``generate`` called directly), and each score must be what ``parse_judge_score`` reads in the reply.
About 3 s after transformers is imported.
"""

from __future__ import annotations

import torch

from roll.core import plugins
from roll.pipelines.rewards.config import LocalJudgeRewardConfig
from roll.pipelines.rewards.judge import parse_judge_score
from roll.pipelines.rewards.types import RewardRequest

REQUESTS = [
    RewardRequest("The answer is 7.", prompt="What is 3+4?", ground_truth="7"),
    RewardRequest("no", prompt="What is 12+30? Show your work.", ground_truth="42"),
    RewardRequest("The answer is 9.", prompt="What is 4+5?", ground_truth="9"),
]


def test_replies_are_the_models_greedy_continuations_and_scores_parse_them() -> None:
    judge = plugins.load("roll.reward", "llm_judge_local").build(
        LocalJudgeRewardConfig(model="tiny-1m", max_new_tokens=8, batch_size=3, score_mode="yes_no")
    )
    prompts = [judge.judge_prompt(r) for r in REQUESTS]
    assert "What is 3+4?" in prompts[0] and "The answer is 7." in prompts[0] and "7" in prompts[0]
    batched = judge.replies(prompts)
    assert batched == [judge.replies([p])[0] for p in prompts]  # left padding changes nothing
    enc = judge.tokenizer(prompts[1], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        ids = judge.model.generate(
            **enc, do_sample=False, max_new_tokens=8, pad_token_id=judge.tokenizer.pad_token_id
        )
    assert batched[1] == judge.tokenizer.decode(ids[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    for result in judge.score(REQUESTS):
        reply = result.info["judge_reply"]
        parsed = parse_judge_score(reply, "yes_no", 10.0)
        assert (result.score, "error" in result.info) == (
            (parsed, False) if parsed is not None else (0.0, True)
        )
