"""CLIP image-text similarity as a differentiable reward, from a local folder or a hub id.

The image is resized and normalized in torch (not the PIL processor), so the gradient reaches the pixels.
"""

from __future__ import annotations

import torch

from roll.diffusion.rewards.config import ClipConfig


class ClipReward:
    """``scale * cos(image embedding, text embedding)``, ``[B]``."""

    differentiable = True

    def __init__(self, config: ClipConfig) -> None:
        from transformers import AutoTokenizer, CLIPModel

        self.model = CLIPModel.from_pretrained(config.model).eval().requires_grad_(False)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model)
        self.scale = config.scale
        size = self.model.config.vision_config.image_size
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
        self.std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)

    def __call__(self, images_BCHW: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        device = images_BCHW.device
        pixels = torch.nn.functional.interpolate(
            images_BCHW, size=self.size, mode="bicubic", align_corners=False
        )
        pixels = (pixels - self.mean.to(device)) / self.std.to(device)
        text = self.tokenizer(prompts, padding=True, truncation=True, return_tensors="pt").to(device)
        image_emb = self.model.get_image_features(pixel_values=pixels)
        text_emb = self.model.get_text_features(**text)
        image_emb = _features(image_emb)
        text_emb = _features(text_emb)
        cos = torch.nn.functional.cosine_similarity(image_emb, text_emb, dim=-1)
        return self.scale * cos

    def to(self, device: torch.device) -> ClipReward:
        self.model.to(device)
        return self


def _features(out: object) -> torch.Tensor:
    """transformers 5 may return a model output instead of the projected tensor."""
    if isinstance(out, torch.Tensor):
        return out
    pooled = getattr(out, "pooler_output", None)
    if isinstance(pooled, torch.Tensor):
        return pooled
    raise TypeError(f"unexpected CLIP feature output {type(out).__name__}")
