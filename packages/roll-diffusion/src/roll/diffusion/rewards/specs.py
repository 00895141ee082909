"""The :class:`roll.core.types.RewardSpec` of each built-in diffusion reward (``roll.diffusion_reward`` group).

Light: only the config models (:mod:`.config`) are imported here; ``build`` imports torch and the reward's model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roll.core.types import RewardSpec
from roll.diffusion.rewards.config import ClipConfig, JpegConfig, ShapeAlignmentConfig

if TYPE_CHECKING:
    from roll.diffusion.rewards.types import ImageReward


def build_shape_alignment(config: ShapeAlignmentConfig) -> ImageReward:
    from roll.diffusion.rewards.image import ShapeAlignmentReward

    return ShapeAlignmentReward(config)


def build_jpeg(config: JpegConfig) -> ImageReward:
    from roll.diffusion.rewards.image import JpegCompressibilityReward

    return JpegCompressibilityReward(config)


def build_clip(config: ClipConfig) -> ImageReward:
    from roll.diffusion.rewards.clip import ClipReward

    return ClipReward(config)


SHAPE_ALIGNMENT = RewardSpec(
    "shape_alignment",
    build_shape_alignment,
    ShapeAlignmentConfig,
    "differentiable: the tiny kit's CNN probability of the prompt's colour and background",
)
JPEG_COMPRESSIBILITY = RewardSpec(
    "jpeg_compressibility", build_jpeg, JpegConfig, "rule reward: minus the JPEG size in kB (DDPO)"
)
CLIP = RewardSpec("clip", build_clip, ClipConfig, "differentiable: CLIP image-text cosine similarity")
