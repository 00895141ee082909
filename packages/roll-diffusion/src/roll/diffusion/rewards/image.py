"""The kit's shape-alignment reward and the JPEG-compressibility rule reward."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from roll.core.errors import DataError
from roll.diffusion.kit.paths import resolve_diffusion_path
from roll.diffusion.kit.scorer import ShapeScorer, alignment_B, label_tensor
from roll.diffusion.kit.tiny import SCORER_DIR
from roll.diffusion.rewards.config import JpegConfig, ShapeAlignmentConfig


class ShapeAlignmentReward:
    """Differentiable: :func:`roll.diffusion.kit.scorer.alignment_B` of the kit's scorer, ``[B]`` in [0, 1]."""

    differentiable = True

    def __init__(self, config: ShapeAlignmentConfig) -> None:
        folder = Path(resolve_diffusion_path(config.scorer))
        if (folder / SCORER_DIR).is_dir():
            folder = folder / SCORER_DIR
        if not (folder / "config.json").is_file():
            raise DataError(
                f"reward.options.scorer: {config.scorer!r} holds no scorer (no {SCORER_DIR}/config.json); "
                "use 'tiny-sd' or a folder the kit wrote"
            )
        self.scorer = ShapeScorer.load(folder)
        self.temperature, self.combine = config.temperature, config.combine

    def __call__(self, images_BCHW: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        labels_B3 = label_tensor(prompts).to(images_BCHW.device)
        return alignment_B(
            self.scorer, images_BCHW, labels_B3, temperature=self.temperature, combine=self.combine
        )

    def to(self, device: torch.device) -> ShapeAlignmentReward:
        self.scorer.to(device)
        return self


class JpegCompressibilityReward:
    """``-size_kB`` of each image as an 8-bit JPEG (PIL); not differentiable, ``[B]``."""

    differentiable = False

    def __init__(self, config: JpegConfig) -> None:
        self.quality = config.quality

    def __call__(self, images_BCHW: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        pixels = to_uint8(images_BCHW)
        sizes = [jpeg_kilobytes(img, self.quality) for img in pixels]
        return -torch.tensor(sizes, dtype=torch.float32, device=images_BCHW.device)

    def to(self, device: torch.device) -> JpegCompressibilityReward:
        return self


def to_uint8(images_BCHW: torch.Tensor) -> np.ndarray:
    """``[B, H, W, 3]`` uint8 of images in [0, 1] (rounded as diffusers' ``numpy_to_pil`` does)."""
    array = images_BCHW.detach().float().clamp(0, 1).permute(0, 2, 3, 1).cpu().numpy()
    return (array * 255).round().astype(np.uint8)


def jpeg_kilobytes(image_HW3: np.ndarray, quality: int) -> float:
    buffer = io.BytesIO()
    Image.fromarray(image_HW3).save(buffer, format="JPEG", quality=quality)
    return buffer.tell() / 1000.0
