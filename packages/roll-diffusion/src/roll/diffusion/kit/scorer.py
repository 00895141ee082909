"""The kit's differentiable colour/shape scorer: a small CNN with three heads (object colour, shape, background).

Trained by the kit on the rendered shapes (ground-truth labels, so it is an honest, independent judge of the
generator), saved as ``config.json`` + ``model.safetensors``. Its input is an image in [0, 1], ``[B, 3, H, W]``,
and everything is differentiable, so ``d reward / d image`` exists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from roll.diffusion.kit import shapes

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class ShapeScorer(nn.Module):
    """``[B, 3, H, W]`` in [0, 1] -> logits of colour ``[B, 4]``, shape ``[B, 3]``, background ``[B, 4]``."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.width = width
        self.body = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1),
            nn.SiLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            nn.SiLU(),
            nn.Conv2d(2 * width, 2 * width, 3, stride=2, padding=1),
            nn.SiLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.heads = nn.ModuleList(
            nn.Linear(2 * width, n) for n in (len(shapes.COLORS), len(shapes.SHAPES), 4)
        )

    def forward(self, images_BCHW: torch.Tensor) -> list[torch.Tensor]:
        features = self.body(images_BCHW * 2.0 - 1.0)
        return [head(features) for head in self.heads]

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_FILE).write_text(json.dumps({"width": self.width}), encoding="utf-8")
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(folder / WEIGHTS_FILE))

    @classmethod
    def load(cls, folder: Path) -> ShapeScorer:
        from safetensors.torch import load_file

        model = cls(**json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")))
        model.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
        model.eval()
        model.requires_grad_(False)
        return model


def label_tensor(prompts: list[str]) -> torch.Tensor:
    """``[B, 3]`` class indices of kit captions."""
    return torch.tensor([shapes.labels(p) for p in prompts], dtype=torch.long)


def train_scorer(captions: list[str], images_NCHW: torch.Tensor, steps: int, seed: int = 0) -> ShapeScorer:
    """Cross-entropy on the three heads; ``images_NCHW`` in [-1, 1] (the kit's dataset), jittered by noise."""
    gen = torch.Generator().manual_seed(seed)
    model = ShapeScorer()
    labels_N3 = label_tensor(captions)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        idx = torch.randint(0, len(captions), (64,), generator=gen)
        x = ((images_NCHW[idx] + 1.0) / 2.0 + 0.1 * torch.randn(images_NCHW[idx].shape, generator=gen)).clamp(
            0, 1
        )
        logits = model(x)
        loss = sum(nn.functional.cross_entropy(lg, labels_N3[idx, h]) for h, lg in enumerate(logits))
        opt.zero_grad()
        loss.backward()  # type: ignore[union-attr]
        opt.step()
    model.eval()
    model.requires_grad_(False)
    return model


REWARD_HEADS = (0, 2)
"""The heads the reward reads: object colour and background. The shape head stays near chance on 16-pixel
renders (0.44 on fresh renders after the kit's 500 steps, 3 classes), too weak to judge a generator by."""


def alignment_B(
    scorer: ShapeScorer,
    images_BCHW: torch.Tensor,
    labels_B3: torch.Tensor,
    *,
    temperature: float = 1.0,
    combine: Literal["mean", "geometric"] = "mean",
) -> torch.Tensor:
    """The probabilities ``p_h`` the scorer gives the prompt's label on each of :data:`REWARD_HEADS` (softmax of
    ``logits / temperature``), combined into ``[B]`` in [0, 1]: ``mean`` is ``(p_colour + p_background) / 2``;
    ``geometric`` is ``sqrt(p_colour * p_background)``, which a one-colour image cannot raise (a caption's object
    and background colours differ, so such an image scores near 0 on one head and so near 0 overall, where the
    mean still gives it half the reward of every prompt that names its colour)."""
    logits = scorer(images_BCHW)
    probs_BH = torch.stack(
        [
            (logits[h] / temperature).softmax(-1).gather(1, labels_B3[:, h : h + 1]).squeeze(1)
            for h in REWARD_HEADS
        ],
        dim=1,
    )
    if combine == "geometric":
        return probs_BH.clamp_min(1e-12).log().mean(dim=1).exp()
    return probs_BH.mean(dim=1)
