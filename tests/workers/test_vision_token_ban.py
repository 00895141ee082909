"""The vision-token ban is on-policy: no sampler emits a VLM's vision markers (``<|vision_start|>``,
``<|vision_end|>``, ``<|image_pad|>``, ``<|video_pad|>``; :func:`roll.workers.vision.vision_token_ids`) and every
scorer with ``score_without_vision_tokens: true`` (hf, fsdp2) leaves them out of its softmax too, so the log-prob a
sample carries equals its score and the PPO ratio starts at 1. Off by default: turned on, the seeded GRPO run of
``tests/pipelines/test_rlvr_vlm.py`` no longer learns to read the picture (0.354 -> 0.354 instead of -> 0.646).

Without the scorers' half the ratio started off 1 by the banned mass: the decode loop reports
``logp_ban = logp_full - log(1 - p_banned)`` while a full-vocabulary scorer gives ``logp_full``. On a random
tiny-vl-1m ``p_banned`` is about 4 / vocab per position (measured > 1e-3 here), far above the fp32 tolerance of
``assert_close`` (1e-5), so the equality below fails if either side forgets the ban. A text model has no vision
markers and its scores are bitwise those of the path without a ban.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from PIL import Image

from roll.core import columns as C
from roll.data.vision import IMAGE_SPAN, encode_images, expand_image_pads, tokens_per_image
from roll.workers.config import FSDP2Config, HFInferConfig, SamplingParams
from roll.workers.fsdp2 import FSDP2TrainStrategy
from roll.workers.hf_infer import HFInferStrategy
from roll.workers.logprobs import (
    forward_scores,
    has_prev_from_mask,
    logprobs_from_logits,
    never_sampled_ids,
    position_ids_from_mask,
    shifted_scores,
)
from roll.workers.roles.config import ModelConfig
from roll.workers.roles.model import load_causal_lm
from roll.workers.vision import config_vision_token_ids, vision_inputs, vision_token_ids
from roll.workers.vllm_infer import never_sampled_bias

SAMPLES, NEW_TOKENS = 4, 6


@pytest.fixture(scope="module")
def vlm() -> dict[str, Any]:
    """tiny-vl-1m with one image prompt: the chat-templated question, its image pads expanded, the pixels."""
    from transformers import AutoTokenizer

    from roll.data.models import load_image_processor
    from roll.data.tiny_vl import tiny_vl_model_path

    path = tiny_vl_model_path("tiny-vl-1m")
    tok = AutoTokenizer.from_pretrained(path)
    msgs = [{"role": "user", "content": IMAGE_SPAN + "What colour is the shape?"}]
    ids = tok(
        tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )
    pixels, grid = encode_images([Image.new("RGB", (32, 32), (230, 40, 40))], load_image_processor(str(path)))
    prompt, _ = expand_image_pads(
        ids["input_ids"], tokens_per_image(grid, 2), tok.convert_tokens_to_ids("<|image_pad|>")
    )
    model = load_causal_lm(ModelConfig(path=str(path)), "test")
    return {"path": path, "model": model, "prompt": prompt, "pixels": pixels, "grid": grid}


def _sampled(vlm: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, dict[str, list[Any]], torch.Tensor]:
    """``SAMPLES`` seeded samples of the prompt as ``(ids_BT, mask_BT, vision, sampled logp [B, NEW_TOKENS])``."""
    vision = {C.PIXEL_VALUES: [vlm["pixels"]], C.IMAGE_GRID_THW: [vlm["grid"]]}
    params = SamplingParams(n=SAMPLES, temperature=1.0, max_new_tokens=NEW_TOKENS, ignore_eos=True, seed=0)
    samples = HFInferStrategy(vlm["model"], HFInferConfig()).generate([vlm["prompt"]], params, vision=vision)
    ids_BT = torch.tensor([vlm["prompt"] + s.token_ids for s in samples])
    rows = {k: v * SAMPLES for k, v in vision.items()}
    return ids_BT, torch.ones_like(ids_BT), rows, torch.tensor([s.logprobs for s in samples])


def test_a_vlm_samples_log_probs_equal_what_every_scorer_gives(vlm: dict[str, Any]) -> None:
    """The decode loop's log-probs of 4 samples equal, on the same tokens: the hf scorer (reference, old
    log-probs), the fsdp2 trainer's ``compute_logprobs`` and the trainer loss's path (``score_mask``); and they
    are ``logp_full - log(1 - p_banned)`` of a plain full-vocabulary forward (the gap the ban used to leave)."""
    model = vlm["model"]
    ids_BT, mask_BT, vision, sampled_BN = _sampled(vlm)
    response = slice(len(vlm["prompt"]), None)
    on = {"score_without_vision_tokens": True}
    hf = HFInferStrategy(model, HFInferConfig(**on)).compute_logprobs(ids_BT, mask_BT, vision=vision).logp_BT
    trainer = FSDP2TrainStrategy(copy.deepcopy(model), FSDP2Config(micro_batch_size=2, **on))
    old = trainer.compute_logprobs(ids_BT, mask_BT, vision=vision).logp_BT
    score_mask = torch.zeros_like(mask_BT)
    score_mask[:, response] = 1
    with torch.no_grad():
        loss_path, _ = forward_scores(
            model, ids_BT, mask_BT, score_mask=score_mask, vision=vision, without_vision_tokens=True
        )
    for scores in (hf, old, loss_path):
        torch.testing.assert_close(scores[:, response], sampled_BN)
    full_BN, banned_BN = _full_vocabulary(model, ids_BT, mask_BT, vision)
    assert banned_BN.min() > 1e-3, banned_BN  # else the ban could not show
    torch.testing.assert_close(sampled_BN, (full_BN - torch.log1p(-banned_BN))[:, response.start - 1 : -1])
    off = HFInferStrategy(model, HFInferConfig()).compute_logprobs(ids_BT, mask_BT, vision=vision).logp_BT
    torch.testing.assert_close(
        off[:, response], full_BN[:, response.start - 1 : -1]
    )  # the default: full vocab


def _full_vocabulary(
    model: Any, ids_BT: torch.Tensor, mask_BT: torch.Tensor, vision: dict[str, list[Any]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log p_full(ids[:, t + 1])`` and the vision markers' mass ``p_banned`` at each position ``t``."""
    inputs = {"input_ids": ids_BT, "attention_mask": mask_BT, "position_ids": position_ids_from_mask(mask_BT)}
    inputs.update(vision_inputs(model, ids_BT, mask_BT, vision))
    with torch.no_grad():
        logp_BTV = model(**inputs, use_cache=False).logits.float().log_softmax(-1)
    next_BT = torch.roll(ids_BT, -1, dims=1)
    banned_BT = logp_BTV[..., vision_token_ids(model)].exp().sum(-1)
    return logp_BTV.gather(-1, next_BT[..., None]).squeeze(-1), banned_BT


def test_a_text_models_scores_are_unchanged_bitwise() -> None:
    from roll.data.tiny import build_tiny_model

    model = build_tiny_model("tiny-1m", seed=0)
    assert vision_token_ids(model) == [] and never_sampled_ids(model, torch.device("cpu")) is None
    ids_BT = torch.randint(3, 200, (3, 12), generator=torch.Generator().manual_seed(0))
    mask_BT = torch.ones_like(ids_BT)
    mask_BT[1, :4] = 0
    with torch.no_grad():
        got, _ = forward_scores(model, ids_BT, mask_BT, without_vision_tokens=True)
        logits = model(
            input_ids=ids_BT,
            attention_mask=mask_BT,
            position_ids=position_ids_from_mask(mask_BT),
            use_cache=False,
        ).logits
    want, _ = shifted_scores(logits, ids_BT, has_prev_from_mask(mask_BT))  # the scorer without a ban
    assert torch.equal(got, want)


def test_the_ban_renormalizes_over_the_rest_and_keeps_banned_labels_whole() -> None:
    """Logits ``[0, 0, ln 3, 0]`` with token 3 banned: ``p = [1, 1, 3] / 5`` over tokens 0-2, so label 2 scores
    ``ln 3/5`` and the entropy is ``-(2/5 ln 1/5 + 3/5 ln 3/5)``; label 3 itself (a prompt's image pad) keeps
    the full softmax, ``ln 1/6``, finite."""
    logits = torch.tensor([[0.0, 0.0, math.log(3), 0.0]] * 2, requires_grad=True)
    logp, ent = logprobs_from_logits(
        logits, torch.tensor([2, 3]), with_entropy=True, never_sampled=torch.tensor([3])
    )
    assert ent is not None
    torch.testing.assert_close(logp, torch.tensor([math.log(3 / 5), math.log(1 / 6)]))
    torch.testing.assert_close(ent[0], torch.tensor(-(2 / 5 * math.log(1 / 5) + 3 / 5 * math.log(3 / 5))))
    logp[0].backward()
    assert logits.grad is not None and logits.grad[0, 3] == 0 and torch.isfinite(logits.grad).all()


def test_vllm_bans_the_same_ids_through_logit_bias(vlm: dict[str, Any]) -> None:
    """The vllm strategy reads the ids from the model folder's config (it has no module): the same four as the hf
    loop, each biased to ``-inf``; a text model's requests carry no bias."""
    from transformers import AutoConfig

    from roll.data.tiny import tiny_model_path

    ids = config_vision_token_ids(AutoConfig.from_pretrained(vlm["path"]))
    assert ids == vision_token_ids(vlm["model"]) and len(set(ids)) == 4
    assert never_sampled_bias(ids) == {i: float("-inf") for i in ids}
    assert config_vision_token_ids(AutoConfig.from_pretrained(tiny_model_path("tiny-1m"))) == []
    assert never_sampled_bias([]) is None
