"""Images reach the model in the hf and fsdp2 strategies (tiny-vl-1m, no Ray), and the vLLM prompt form.

- the same prompt with a different image gives different log-probs; the same image gives the same ones, in any
  micro-batch split and padding;
- our KV-cached decode loop with explicit 3-D rotary positions picks the same greedy tokens as transformers' own
  ``generate`` (which derives the positions itself): the decode positions after an image are right;
- fsdp2 trains on image rows (loss falls, the vision tower's weights change) and scores like hf;
- a VLM saved to a local folder loads through the roles' loader (``AutoModelForImageTextToText``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _vl_helpers import assert_pixels_move_the_scores, load_kit, padded
from PIL import Image

from roll.core import columns as C
from roll.data.vision import IMAGE_SPAN, encode_images, expand_image_pads, tokens_per_image
from roll.workers.config import FSDP2Config, HFInferConfig, OptimizerConfig, SamplingParams
from roll.workers.fsdp2 import FSDP2TrainStrategy
from roll.workers.hf_infer import HFInferStrategy
from roll.workers.roles.config import ModelConfig
from roll.workers.roles.model import load_causal_lm
from roll.workers.types import ForwardOutput, LossDefaults, MicroBatch
from roll.workers.vision import collapse_image_pads, multimodal_prompt, vision_token_ids


@pytest.fixture(scope="module")
def kit() -> dict[str, Any]:
    return load_kit()


def _row(
    kit: dict[str, Any], colour: tuple[int, int, int], text: str = "What colour is it?"
) -> dict[str, Any]:
    tok = kit["tokenizer"]
    msgs = [{"role": "user", "content": IMAGE_SPAN + text}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pixels, grid = encode_images([Image.new("RGB", (32, 32), colour)], kit["processor"])
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    ids, _ = expand_image_pads(ids, tokens_per_image(grid, 2), pad)
    return {"ids": ids, C.PIXEL_VALUES: pixels, C.IMAGE_GRID_THW: grid}


def _padded(rows: list[dict[str, Any]], pad: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, list[Any]]]:
    return padded(rows, pad, C.IMAGE_COLUMNS)


def test_a_different_image_changes_the_logprobs(kit: dict[str, Any]) -> None:
    red, blue = _row(kit, (230, 40, 40)), _row(kit, (60, 90, 240))
    assert_pixels_move_the_scores(kit, red, blue, C.IMAGE_COLUMNS, after=6)  # the text after the image span


def test_greedy_decode_matches_transformers_generate(kit: dict[str, Any]) -> None:
    model, tok = kit["model"], kit["tokenizer"]
    row = _row(kit, (40, 200, 60))
    hf = HFInferStrategy(model, HFInferConfig())
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=6, ignore_eos=True)
    vision = {k: [row[k]] for k in C.IMAGE_COLUMNS}
    ours = hf.generate([row["ids"]], params, vision=vision)[0].token_ids
    ids = torch.tensor([row["ids"]])
    mm = (ids == model.config.image_token_id).int()
    with torch.no_grad():
        theirs = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=row[C.PIXEL_VALUES],
            image_grid_thw=row[C.IMAGE_GRID_THW], mm_token_type_ids=mm, do_sample=False,
            max_new_tokens=6, min_new_tokens=6, eos_token_id=None, pad_token_id=tok.pad_token_id,
        )  # fmt: skip
    assert ours == theirs[0, ids.shape[1] :].tolist()


def test_decode_never_samples_a_vision_marker(kit: dict[str, Any]) -> None:
    """With the image-pad logit pushed 1e4 above the rest, every sampled token would be ``<|image_pad|>``; the
    decode loop bans the four vision markers (a sampled pad has no picture, and breaks the trainer's forward)."""
    model = kit["model"]
    banned = vision_token_ids(model)
    assert len(banned) == 4 and model.config.image_token_id in banned

    def favour_the_pad(module: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
        out[..., model.config.image_token_id] += 1e4
        return out

    row = _row(kit, (230, 40, 40))
    hook = model.lm_head.register_forward_hook(favour_the_pad)
    try:
        params = SamplingParams(n=4, temperature=1.0, max_new_tokens=4, ignore_eos=True)
        vision = {k: [row[k]] for k in C.IMAGE_COLUMNS}
        samples = HFInferStrategy(model, HFInferConfig()).generate([row["ids"]], params, vision=vision)
    finally:
        hook.remove()
    tokens = [t for s in samples for t in s.token_ids]
    assert len(tokens) == 16 and not set(tokens) & set(banned)


def test_a_row_with_a_stray_image_token_is_a_clear_error(kit: dict[str, Any]) -> None:
    """A response holding ``<|image_pad|>`` gives its row 5 image tokens for a picture that fills 4 (32 x 32,
    patch 8, merge 2): the error names the row and both counts instead of the rotary index's shape mismatch."""
    from roll.core.errors import WorkerError
    from roll.workers.vision import vision_inputs

    model, row = kit["model"], _row(kit, (230, 40, 40))
    ids, mask, vision = _padded([row, {**row, "ids": [*row["ids"], model.config.image_token_id]}], 0)
    with pytest.raises(WorkerError, match="row 1 holds 5 image tokens but its images fill 4"):
        vision_inputs(model, ids, mask, vision)
    assert vision_inputs(model, ids[:1, : len(row["ids"])], mask[:1, : len(row["ids"])], _one(vision))


def _one(vision: dict[str, list[Any]]) -> dict[str, list[Any]]:
    return {k: v[:1] for k, v in vision.items()}


class _NLL(LossDefaults):
    def __call__(
        self, output: ForwardOutput, micro_batch: MicroBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return -(output.logp_BT * micro_batch[C.RESPONSE_MASK]).sum(), {}

    def count_units(self, micro_batch: MicroBatch) -> float:
        return float(micro_batch[C.RESPONSE_MASK].sum())


def test_fsdp2_trains_on_images_and_scores_like_hf(kit: dict[str, Any]) -> None:
    import copy

    rows = [_row(kit, c) for c in [(230, 40, 40), (60, 90, 240), (40, 200, 60), (235, 215, 40)]]
    ids, mask, vision = _padded(rows, kit["tokenizer"].pad_token_id)
    model = copy.deepcopy(kit["model"])
    strategy = FSDP2TrainStrategy(model, FSDP2Config(micro_batch_size=2, optimizer=OptimizerConfig(lr=1e-3)))
    hf_logp = HFInferStrategy(copy.deepcopy(kit["model"])).compute_logprobs(ids, mask, vision=vision).logp_BT
    torch.testing.assert_close(
        strategy.compute_logprobs(ids, mask, vision=vision).logp_BT, hf_logp, atol=1e-5, rtol=0
    )
    loss_mask = mask.clone()
    loss_mask[:, 0] = 0
    batch: dict[str, Any] = {C.INPUT_IDS: ids, C.ATTENTION_MASK: mask, C.RESPONSE_MASK: loss_mask, **vision}
    patch = model.model.visual.patch_embed.proj.weight.detach().clone()
    losses = [strategy.train_step(batch, _NLL()).loss for _ in range(4)]
    assert losses[-1] < losses[0] - 0.1, losses
    assert not torch.equal(patch, model.model.visual.patch_embed.proj.weight)


def test_a_local_vlm_folder_loads_through_the_same_code(kit: dict[str, Any], tmp_path: Path) -> None:
    kit["model"].save_pretrained(tmp_path)
    kit["tokenizer"].save_pretrained(tmp_path)
    loaded = load_causal_lm(ModelConfig(path=str(tmp_path)), "actor_train")
    assert type(loaded).__name__ == "Qwen2VLForConditionalGeneration"
    n = sum(p.numel() for p in loaded.parameters())
    assert 1.0e6 < n < 1.2e6  # tiny-vl-1m: 1.09M


def test_vllm_prompt_collapses_pads_and_carries_the_images() -> None:
    assert collapse_image_pads([1, 7, 7, 7, 2, 7, 7, 3], 7) == [1, 7, 2, 7, 3]
    image = Image.new("RGB", (32, 32))
    prompt = multimodal_prompt([1, 7, 7, 2], [image], 7)
    assert prompt["prompt_token_ids"] == [1, 7, 2] and len(prompt["multi_modal_data"]["image"]) == 1
    assert multimodal_prompt([1, 2], None, 7) == {"prompt_token_ids": [1, 2]}


@pytest.mark.gpu
def test_vllm_generates_with_images(kit: dict[str, Any]) -> None:
    """vLLM gets the images as ``multi_modal_data`` (pads collapsed, re-expanded by its processor): one image's
    log-probs differ from another's on the same tokens, and every sample is as long as asked."""
    pytest.importorskip("vllm")
    from roll.workers.gpu_specs import VLLM
    from roll.workers.vllm_config import VLLMConfig

    strategy = VLLM.build(
        VLLMConfig(gpu_memory_utilization=0.25, enforce_eager=True, dtype="float32", max_model_len=256),
        kit["path"],
    )
    try:
        red, blue = _row(kit, (230, 40, 40)), _row(kit, (60, 90, 240))
        images = [Image.new("RGB", (32, 32), c) for c in ((230, 40, 40), (60, 90, 240))]
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=4, ignore_eos=True)
        out = strategy.generate(
            [red["ids"], blue["ids"]], params, vision={C.IMAGES: [[images[0]], [images[1]]]}
        )
        assert [len(s.token_ids) for s in out] == [4, 4]
        assert out[0].logprobs != out[1].logprobs
    finally:
        strategy.shutdown()
