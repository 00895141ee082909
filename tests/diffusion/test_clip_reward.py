"""The ``clip`` reward plugin on a local folder: a tiny ``CLIPModel`` built from a config (random weights, fixed
seed) and the kit's word-level tokenizer, saved with ``save_pretrained``. No hub, about a second after imports."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

PROMPTS = ["a red circle on blue", "a green square on yellow"]


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import CLIPConfig, CLIPModel

    from roll.diffusion.kit.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    config = CLIPConfig(
        text_config={"vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 16,
                     "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                     "pad_token_id": tokenizer.pad_token_id},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
        projection_dim=16,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("clip")
    CLIPModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_clip_reward_is_the_models_cosine_and_reaches_the_pixels(clip_folder: Path) -> None:
    """Through the plugin group: ``scale * cos(image, text)`` equals CLIPModel's own ``logits_per_image``
    diagonal divided by its logit scale (the cosine, computed on the same resized, normalized pixels), and the
    gradient of the reward reaches every image."""
    from transformers import AutoTokenizer, CLIPModel

    from roll.core import plugins
    from roll.diffusion.reward_fl import REWARD_GROUP
    from roll.diffusion.rewards.config import ClipConfig

    spec = plugins.load(REWARD_GROUP, "clip")
    reward = spec.build(ClipConfig(model=str(clip_folder), scale=2.0))
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
    got_B = reward(images, PROMPTS)
    assert got_B.shape == (2,)
    got_B.sum().backward()
    assert images.grad is not None and bool((images.grad.abs().sum(dim=(1, 2, 3)) > 0).all())

    model = CLIPModel.from_pretrained(clip_folder).eval()
    text = AutoTokenizer.from_pretrained(clip_folder)(PROMPTS, padding=True, return_tensors="pt")
    pixels = torch.nn.functional.interpolate(
        images.detach(), size=(32, 32), mode="bicubic", align_corners=False
    )
    pixels = (pixels - reward.mean) / reward.std
    with torch.no_grad():
        out = model(input_ids=text.input_ids, attention_mask=text.attention_mask, pixel_values=pixels)
    cos_B = out.logits_per_image.diagonal() / model.logit_scale.exp()
    torch.testing.assert_close(got_B.detach(), 2.0 * cos_B, rtol=1e-4, atol=1e-5)
