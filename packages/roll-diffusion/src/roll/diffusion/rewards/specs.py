"""The :class:`roll.core.types.RewardSpec` of each built-in diffusion reward (``roll.diffusion_reward`` group).

Light: only the config models are imported here; ``build`` imports torch and the reward's model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from roll.core.config.base import RollModel
from roll.core.types import RewardSpec

if TYPE_CHECKING:
    from roll.diffusion.rewards.types import ImageReward


class ShapeAlignmentConfig(RollModel):
    """The kit's scorer: mean probability of the prompt's colour and background (prompts must be kit
    captions). ``scorer`` is a kit preset or a folder holding ``roll_scorer/``."""

    scorer: str = Field("tiny-sd", description="a kit preset, or a folder holding roll_scorer/")
    combine: Literal["mean", "geometric"] = Field(
        "mean",
        description="how the colour and background probabilities combine: geometric keeps a one-colour image "
        "from scoring on the prompts that name its colour (see alignment_B)",
    )
    temperature: float = Field(
        4.0,
        gt=0,
        description="logits / temperature before the softmax: at 1 the scorer is near-certain on samples "
        "(probabilities 0 or 1, reward gradient ~1e-5, measured), which stalls DRaFT",
    )


class JpegConfig(RollModel):
    """``-kilobytes`` of the image saved as JPEG at ``quality`` (DDPO's compressibility reward)."""

    quality: int = Field(
        95, ge=1, le=100, description="JPEG quality the image is saved at before it is measured"
    )


class ClipConfig(RollModel):
    """Cosine similarity of CLIP image and text embeddings times ``scale``; ``model`` is a local folder or hub id
    of a ``CLIPModel`` with its processor (e.g. ``openai/clip-vit-base-patch32``)."""

    model: str = Field(description="a CLIPModel with its processor: local folder or hub id")
    scale: float = Field(1.0, gt=0, description="the cosine similarity is multiplied by this")


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
