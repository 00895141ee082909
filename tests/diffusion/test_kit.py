"""The tiny kit: captions, rendering, the tokenizer, and the warmed scorer as an honest judge."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from roll.core.errors import DataError
from roll.diffusion.kit import shapes


def test_captions_parse_and_render_deterministically() -> None:
    captions = shapes.all_captions()
    assert len(captions) == 4 * 3 * 3 and len(set(captions)) == 36
    assert shapes.parse_caption("a red circle on blue") == ("red", "circle", "blue")
    image = shapes.render("a red circle on blue", seed=3, size=16)
    assert image.shape == (16, 16, 3)
    np.testing.assert_array_equal(image, shapes.render("a red circle on blue", seed=3, size=16))
    assert tuple(image[0, 0]) == shapes.COLORS["blue"]  # a corner is background: the shape keeps a margin
    with pytest.raises(DataError, match="expected 'a <color> <shape> on <color>'"):
        shapes.parse_caption("a purple circle on blue")


def test_tokenizer_is_word_level_and_pads_to_eight() -> None:
    from roll.diffusion.kit.tiny import build_tokenizer

    tok = build_tokenizer()
    ids = tok("a red circle on blue", padding="max_length", max_length=8).input_ids
    assert len(ids) == 8 and ids[0] == tok.bos_token_id and ids[6] == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "a red circle on blue"


def test_the_warmed_scorer_recognises_fresh_renders(tiny_sd: Path) -> None:
    """On renders with seeds the kit never trained on, the scorer names colour and background almost always (it
    judges the generator, so it must be right about real images); its shape head is near chance at 16 px
    (measured 0.44), which is why the reward reads only the other two."""
    from roll.diffusion.kit.scorer import ShapeScorer, label_tensor
    from roll.diffusion.kit.tiny import IMAGE_SIZE, SCORER_DIR

    scorer = ShapeScorer.load(tiny_sd / SCORER_DIR)
    captions = shapes.all_captions() * 2
    pixels = np.stack(
        [shapes.render(c, seed=10_000_000 + i, size=IMAGE_SIZE) for i, c in enumerate(captions)]
    )
    x = torch.from_numpy(pixels).float().permute(0, 3, 1, 2) / 255.0
    with torch.no_grad():
        logits = scorer(x)
    labels = label_tensor(captions)
    accuracy = [float((lg.argmax(-1) == labels[:, h]).float().mean()) for h, lg in enumerate(logits)]
    assert accuracy[0] > 0.95 and accuracy[2] > 0.95, accuracy


def test_geometric_alignment_denies_a_one_colour_image_what_the_mean_gives(tiny_sd: Path) -> None:
    """A solid blue image on the 8 eval prompts: the mean of the colour and background probabilities pays it
    0.25 on average (measured; it scores wherever a prompt names blue, which is how the default run collapsed),
    the geometric mean 0.14; true renders score about 0.87 either way."""
    from roll.diffusion.reward_fl import DEFAULT_EVAL_PROMPTS as prompts
    from roll.diffusion.rewards.config import ShapeAlignmentConfig
    from roll.diffusion.rewards.image import ShapeAlignmentReward

    blue = (
        torch.tensor(shapes.COLORS["blue"]).float().div(255).view(1, 3, 1, 1).expand(len(prompts), 3, 16, 16)
    )
    renders = torch.tensor(np.stack([shapes.render(p, 0, 16) for p in prompts])).permute(0, 3, 1, 2) / 255
    mean, geometric = (ShapeAlignmentReward(ShapeAlignmentConfig(combine=c)) for c in ("mean", "geometric"))
    assert float(geometric(blue, prompts).mean()) < 0.6 * float(mean(blue, prompts).mean())
    assert float(geometric(renders.float(), prompts).mean()) > 0.8


def test_pixel_diversity_is_the_mean_pairwise_rms() -> None:
    """Black, black, white: pairs (0, 1) 0, (0, 2) 1, (1, 2) 1 -> 2/3; one picture repeated -> 0."""
    from roll.diffusion.outputs import pixel_diversity

    black, white = np.zeros((4, 4, 3), np.uint8), np.full((4, 4, 3), 255, np.uint8)
    assert pixel_diversity(np.stack([black, black, white])) == pytest.approx(2 / 3)
    assert pixel_diversity(np.stack([white] * 3)) == 0.0
