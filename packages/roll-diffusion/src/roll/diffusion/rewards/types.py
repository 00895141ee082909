"""The protocol every diffusion reward follows (the object a ``roll.diffusion_reward`` spec's ``build`` returns)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@runtime_checkable
class ImageReward(Protocol):
    """``images_BCHW`` in [0, 1] (a video is scored frame by frame and averaged by the caller) -> ``[B]``.

    ``differentiable`` says whether the result carries a gradient to the images; DRaFT-style training needs it,
    DDPO does not. ``to`` moves the reward's own model (if any) to the trainer's device.
    """

    differentiable: bool

    def __call__(self, images_BCHW: torch.Tensor, prompts: list[str]) -> torch.Tensor: ...

    def to(self, device: torch.device) -> ImageReward: ...
