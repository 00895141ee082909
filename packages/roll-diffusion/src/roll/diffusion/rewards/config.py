"""Config models of the built-in diffusion rewards (light: pydantic only).

Kept apart from the reward modules so :mod:`roll.diffusion.rewards.specs` (what the entry points name) and the
rewards themselves (:mod:`.image`, :mod:`.clip`) both import them, without the specs and the rewards importing
each other.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from roll.core.config.base import RollModel


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
