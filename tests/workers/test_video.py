"""Videos reach the model in the hf and fsdp2 strategies (tiny-vl-1m in process, no Ray), and the vLLM request.

- the same prompt with a different last frame gives different log-probs after the video, and equal frames equal
  ones, in any micro-batch split;
- our KV-cached decode loop with explicit 3-D positions picks transformers' own ``generate`` tokens for a video
  prompt (``mm_token_type_ids`` 2 on the video tokens), so the video's positions are right;
- a row with an image and a video gets each its own grid; a stray ``<|video_pad|>`` is a clear error;
- fsdp2 scores video rows like hf and a train step moves the vision tower;
- the vLLM request carries each video as ``(frames [F, H, W, 3] uint8, metadata)`` with its pads collapsed.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from _roles_helpers import TokenSumNLL
from _vl_helpers import assert_pixels_move_the_scores, load_kit, padded
from PIL import Image

from roll.core import columns as C
from roll.core.errors import WorkerError
from roll.data.video import VIDEO_SPAN, encode_videos
from roll.data.vision import IMAGE_SPAN, encode_images, expand_image_pads, tokens_per_image
from roll.workers.config import FSDP2Config, HFInferConfig, OptimizerConfig, SamplingParams
from roll.workers.fsdp2 import FSDP2TrainStrategy
from roll.workers.hf_infer import HFInferStrategy
from roll.workers.vision import multimodal_prompt, vision_inputs, vision_token_ids

RED, GREEN, BLUE = (230, 40, 40), (40, 200, 60), (60, 90, 240)


@pytest.fixture(scope="module")
def kit() -> dict[str, Any]:
    return load_kit()


def _frames(*colours: tuple[int, int, int]) -> list[Image.Image]:
    return [Image.new("RGB", (32, 32), c) for c in colours]


def _row(kit: dict[str, Any], frames: list[Image.Image], image: Image.Image | None = None) -> dict[str, Any]:
    """A chat prompt ``[image span] video span + question``, its pads expanded, with its vision columns."""
    tok = kit["tokenizer"]
    content = (IMAGE_SPAN if image else "") + VIDEO_SPAN + "What colour is the shape in the last frame?"
    text = tok.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    row: dict[str, Any] = {k: None for k in C.VISION_COLUMNS}
    video, grid = encode_videos([frames], kit["processor"])
    ids, _ = expand_image_pads(ids, tokens_per_image(grid, 2), tok.convert_tokens_to_ids("<|video_pad|>"))
    row[C.PIXEL_VALUES_VIDEOS], row[C.VIDEO_GRID_THW] = video, grid
    if image is not None:
        pixels, image_grid = encode_images([image], kit["processor"])
        ids, _ = expand_image_pads(
            ids, tokens_per_image(image_grid, 2), tok.convert_tokens_to_ids("<|image_pad|>")
        )
        row[C.PIXEL_VALUES], row[C.IMAGE_GRID_THW] = pixels, image_grid
    return {"ids": ids, **row}


def _padded(rows: list[dict[str, Any]], pad: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, list[Any]]]:
    return padded(rows, pad, C.VISION_COLUMNS)


def test_a_different_last_frame_changes_the_logprobs(kit: dict[str, Any]) -> None:
    blue, green = _row(kit, _frames(RED, BLUE)), _row(kit, _frames(RED, GREEN))
    assert_pixels_move_the_scores(
        kit, blue, green, C.VISION_COLUMNS, after=12
    )  # the question after the video


def test_greedy_decode_on_a_video_matches_transformers_generate(kit: dict[str, Any]) -> None:
    """Three frames: grid (2, 4, 4), 8 video tokens over two temporal positions."""
    model, tok = kit["model"], kit["tokenizer"]
    row = _row(kit, _frames(RED, GREEN, BLUE))
    assert row[C.VIDEO_GRID_THW].tolist() == [[2, 4, 4]]
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=6, ignore_eos=True)
    vision = {k: [row[k]] for k in C.VISION_COLUMNS}
    ours = HFInferStrategy(model, HFInferConfig()).generate([row["ids"]], params, vision=vision)[0].token_ids
    ids = torch.tensor([row["ids"]])
    mm = 2 * (ids == model.config.video_token_id).int()
    with torch.no_grad():
        theirs = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values_videos=row[C.PIXEL_VALUES_VIDEOS],
            video_grid_thw=row[C.VIDEO_GRID_THW], mm_token_type_ids=mm, do_sample=False,
            max_new_tokens=6, min_new_tokens=6, eos_token_id=None, pad_token_id=tok.pad_token_id,
        )  # fmt: skip
    assert ours == theirs[0, ids.shape[1] :].tolist()
    assert model.config.video_token_id in vision_token_ids(model)  # the decode loop never samples it


def test_an_image_and_a_video_in_one_row_get_their_own_grids(kit: dict[str, Any]) -> None:
    """Image span (4 tokens, one temporal position) then the video (8 tokens, two): the video's temporal axis
    steps by one between its temporal patches, and a stray video pad is an error naming the row."""
    model = kit["model"]
    row = _row(kit, _frames(RED, GREEN, BLUE), image=_frames(BLUE)[0])
    ids, mask, vision = _padded([row], 0)
    inputs = vision_inputs(model, ids, mask, vision)
    assert set(inputs) == {
        "pixel_values",
        "image_grid_thw",
        "pixel_values_videos",
        "video_grid_thw",
        "position_ids",
    }
    video_at = (ids[0] == model.config.video_token_id).nonzero().squeeze(-1)
    temporal = inputs["position_ids"][0, 0, video_at]
    assert (
        temporal[4:].tolist() == [int(temporal[0]) + 1] * 4
        and temporal[:4].tolist() == [int(temporal[0])] * 4
    )
    with torch.no_grad():
        assert model(input_ids=ids, attention_mask=mask, **inputs).logits.shape[1] == ids.shape[1]
    stray = {**row, "ids": [*row["ids"], model.config.video_token_id]}
    ids2, mask2, vision2 = _padded([row, stray], 0)
    with pytest.raises(WorkerError, match="row 1 holds 9 video tokens but its videos fill 8"):
        vision_inputs(model, ids2, mask2, vision2)


def test_fsdp2_scores_video_rows_like_hf_and_trains_the_vision_tower(kit: dict[str, Any]) -> None:
    rows = [_row(kit, _frames(RED, c)) for c in (GREEN, BLUE)]
    ids, mask, vision = _padded(rows, kit["tokenizer"].pad_token_id)
    model = copy.deepcopy(kit["model"])
    strategy = FSDP2TrainStrategy(model, FSDP2Config(micro_batch_size=1, optimizer=OptimizerConfig(lr=1e-3)))
    hf_logp = HFInferStrategy(kit["model"]).compute_logprobs(ids, mask, vision=vision).logp_BT
    torch.testing.assert_close(
        strategy.compute_logprobs(ids, mask, vision=vision).logp_BT, hf_logp, atol=1e-5, rtol=0
    )
    loss_mask = mask.clone()
    loss_mask[:, 0] = 0
    batch: dict[str, Any] = {C.INPUT_IDS: ids, C.ATTENTION_MASK: mask, C.RESPONSE_MASK: loss_mask, **vision}
    patch = model.model.visual.patch_embed.proj.weight.detach().clone()
    losses = [strategy.train_step(batch, TokenSumNLL()).loss for _ in range(2)]
    assert losses[-1] < losses[0], losses
    assert not torch.equal(patch, model.model.visual.patch_embed.proj.weight)


def test_vllm_request_carries_each_video_with_its_metadata() -> None:
    """Image pad 7, video pad 8: each run of pads collapses to one; the video goes as vLLM's ``VideoItem`` tuple
    (frames stacked ``[F, H, W, 3]`` uint8, metadata saying they are already sampled)."""
    frames = _frames(RED, GREEN, BLUE)
    request = multimodal_prompt([1, 7, 7, 2, 8, 8, 8, 8, 3], [frames[0]], 7, [frames], 8)
    assert request["prompt_token_ids"] == [1, 7, 2, 8, 3]
    ((video, metadata),) = request["multi_modal_data"]["video"]
    assert video.shape == (3, 32, 32, 3) and video.dtype == np.uint8 and tuple(video[2, 0, 0]) == BLUE
    assert metadata["total_num_frames"] == 3 and metadata["do_sample_frames"] is False
    assert len(request["multi_modal_data"]["image"]) == 1
    only_video = multimodal_prompt([1, 8, 8, 2], None, None, [frames[:2]], 8)
    assert only_video["prompt_token_ids"] == [1, 8, 2] and set(only_video["multi_modal_data"]) == {"video"}
