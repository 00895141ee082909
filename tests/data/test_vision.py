"""Images in rows (roll.data.vision), the shapes task and the tiny VLM kit's tokenizer and image processor.

Golden counts: the kit's image processor cuts a 32 x 32 image into 8 x 8 patches, grid (1, 4, 4), 16 patches of
3 channels x 2 frames x 8 x 8 = 384 values; merging 2 x 2 leaves 16 / 4 = 4 image tokens. A 48 x 32 image: grid
(1, 4, 6) (height first), 24 patches, 6 tokens.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from roll.core import columns as C
from roll.core.errors import DataError
from roll.data.config import TokenizeConfig
from roll.data.media import attach_vision
from roll.data.tasks import builtin_dataset, get_task, split_of
from roll.data.tokenize import tokenize_dataset
from roll.data.vision import (
    IMAGE_PAD,
    IMAGE_SPAN,
    collate_vision,
    expand_image_pads,
    load_image,
    place_image_tokens,
    vision_columns,
)


@pytest.fixture(scope="module")
def image_processor() -> Any:
    from roll.data.tiny_vl import build_image_processor

    return build_image_processor("tiny-vl-1m")


@pytest.fixture(scope="module")
def vl_tokenizer() -> Any:
    from roll.data.tokenizer import build_tokenizer

    return build_tokenizer("roll-tiny-vl")


def _png(colour: tuple[int, int, int], size: tuple[int, int] = (32, 32)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def test_load_image_from_every_form(tmp_path: Path) -> None:
    data = _png((255, 0, 0))
    (tmp_path / "red.png").write_bytes(data)
    forms = [
        Image.open(io.BytesIO(data)),
        str(tmp_path / "red.png"),
        tmp_path / "red.png",
        data,
        {"bytes": data, "path": None},
        {"bytes": None, "path": str(tmp_path / "red.png")},
    ]
    for form in forms:
        image = load_image(form, row=0)
        assert image.mode == "RGB" and image.getpixel((3, 3)) == (255, 0, 0)


def test_bad_images_name_the_row_and_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"row 3: images\[1\]: image file .*missing.png.* does not exist"):
        load_image(str(tmp_path / "missing.png"), row=3, index=1)
    (tmp_path / "junk.png").write_bytes(b"not an image")
    with pytest.raises(DataError, match=r"row 5: images\[0\]: file .*junk.png.* is not a readable image"):
        load_image(str(tmp_path / "junk.png"), row=5)


def test_placeholders_become_vision_spans() -> None:
    msgs = [{"role": "user", "content": "<image> and <image>: same?"}]
    assert place_image_tokens(msgs, 2)[0]["content"] == f"{IMAGE_SPAN} and {IMAGE_SPAN}: same?"
    plain = [{"role": "system", "content": "s"}, {"role": "user", "content": "What is it?"}]
    placed = place_image_tokens(plain, 1)
    assert placed[0]["content"] == "s" and placed[1]["content"] == IMAGE_SPAN + "What is it?"


def test_more_placeholders_than_images_is_an_error() -> None:
    msgs = [{"role": "user", "content": "<image><image> compare"}]
    with pytest.raises(
        DataError, match=r"row 7: the text has 2 <image> placeholder.* but the row has 1 image"
    ):
        place_image_tokens(msgs, 1, row=7)


def test_expand_pads_repeats_each_pad_by_its_image_tokens() -> None:
    """ids [1, P, 2, P, 3] with counts [2, 3] -> [1, P, P, 2, P, P, P, 3]; labels -100 on every pad."""
    P = 9
    ids, labels = expand_image_pads([1, P, 2, P, 3], [2, 3], P, labels=[-100, -100, 2, -100, 3])
    assert ids == [1, P, P, 2, P, P, P, 3]
    assert labels == [-100, -100, -100, 2, -100, -100, -100, 3]
    with pytest.raises(
        DataError, match=r"row 4: the tokenized prompt has 1 image placeholder token.* 2 image"
    ):
        expand_image_pads([1, P], [2, 2], P, row=4)


def test_attach_vision_and_collate(image_processor: Any) -> None:
    """Row 0: two images (32x32 -> 4 tokens, 48x32 -> 6 tokens); row 1: none."""
    P = 7
    rows = [
        {"prompt_ids": [1, P, 2, P], "images": [_png((0, 0, 255)), _png((0, 255, 0), (48, 32))]},
        {"prompt_ids": [1, 2]},
    ]
    out = attach_vision(rows, image_processor, image_pad_id=P)
    assert out[0]["prompt_ids"] == [1] + [P] * 4 + [2] + [P] * 6 and out[0]["length"] == 12
    assert out[0][C.PIXEL_VALUES].shape == (16 + 24, 384)
    assert out[0][C.IMAGE_GRID_THW].tolist() == [[1, 4, 4], [1, 4, 6]]
    assert out[1][C.PIXEL_VALUES] is None and out[1]["prompt_ids"] == [1, 2]
    cols = vision_columns(out)
    merged = collate_vision(cols[C.PIXEL_VALUES][::-1], cols[C.IMAGE_GRID_THW][::-1])
    torch.testing.assert_close(merged["pixel_values"], out[0][C.PIXEL_VALUES])
    assert merged["image_grid_thw"].shape == (2, 3)
    assert collate_vision([None], [None]) == {} and vision_columns(rows[1:]) == {}


def test_attach_vision_without_images_for_placeholders_raises(image_processor: Any) -> None:
    with pytest.raises(DataError, match=r"rl data: row 0 has image placeholder tokens but no images"):
        attach_vision([{"prompt_ids": [1, 7]}], image_processor, image_pad_id=7, source="rl data")
    with pytest.raises(DataError, match=r"row 0: the tokenized prompt has 1 image placeholder.* 2 image"):
        attach_vision([{"prompt_ids": [7], "images": [_png((1, 1, 1))] * 2}], image_processor, image_pad_id=7)


def test_shapes_task_is_seeded_levelled_and_split() -> None:
    for level in range(4):
        a = builtin_dataset("builtin:shapes", "rl", 6, seed=1, options={"level": level})
        b = builtin_dataset("builtin:shapes", "rl", 6, seed=1, options={"level": level})
        assert a["prompt"] == b["prompt"] and a["ground_truth"] == b["ground_truth"]
        assert a[0]["images"][0].tobytes() == b[0]["images"][0].tobytes()
        assert all(p.startswith("<image>") for p in a["prompt"])
    task = get_task("shapes", level=0)
    assert task.verify("The answer is Red.", "red") and not task.verify("The answer is blue.", "red")
    assert task.extract_answer("it is green I think") == "green"
    train = {p.key for p in _problems("train")}
    held_out = {p.key for p in _problems("eval")}
    assert held_out and not train & held_out and all(split_of(k) == "eval" for k in held_out)


def _problems(split: str) -> list[Any]:
    from roll.data.tasks import problems

    return problems(get_task("shapes", level=0), 40, split=split)  # type: ignore[arg-type]


def test_colour_answer_matches_the_pixels() -> None:
    """Level 0 draws one shape; its centre pixel has the colour the answer names."""
    from roll.data.tasks.visual import COLOURS

    ds = builtin_dataset("builtin:shapes", "rl", 20, options={"level": 0})
    for row in ds:
        image = row["images"][0]
        colours = {image.getpixel((x, y)) for x in range(32) for y in range(32)} - {(0, 0, 0)}
        assert COLOURS[row["ground_truth"]] in colours


def test_tokenized_prompt_holds_one_pad_per_image(vl_tokenizer: Any, image_processor: Any) -> None:
    ds = builtin_dataset("builtin:shapes", "rl", 4, options={"level": 0})
    cfg = TokenizeConfig(max_length=128)
    mapped, _ = tokenize_dataset(ds, kind="prompt", tokenizer=vl_tokenizer, cfg=cfg)
    pad = vl_tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    rows = mapped.to_list()
    assert all(r["prompt_ids"].count(pad) == 1 for r in rows)
    out = attach_vision(rows, image_processor, image_pad_id=pad)
    assert all(r["prompt_ids"].count(pad) == 4 for r in out)  # a 32x32 image is 4 tokens
    sft, _ = tokenize_dataset(
        builtin_dataset("builtin:shapes", "sft", 4, options={"level": 0}),
        kind="sft",
        tokenizer=vl_tokenizer,
        cfg=cfg,
    )
    sft_rows = attach_vision(sft.to_list(), image_processor, image_pad_id=pad)
    for r in sft_rows:
        trained = [t for t, label in zip(r["input_ids"], r["labels"]) if label != -100]
        assert pad not in trained and vl_tokenizer.decode(trained).startswith("The answer is")


def test_vl_tokenizer_keeps_vision_tokens_whole(vl_tokenizer: Any) -> None:
    ids = vl_tokenizer(IMAGE_SPAN + "What colour is the shape?")["input_ids"]
    assert vl_tokenizer.convert_ids_to_tokens(ids[:3]) == ["<|vision_start|>", IMAGE_PAD, "<|vision_end|>"]
    assert vl_tokenizer.convert_tokens_to_ids("<|endoftext|>") == 0  # roll-tiny's specials keep ids 0..4
