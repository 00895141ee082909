"""Videos in rows (roll.data.video): frames to Qwen2-VL video patches, their tokens, errors, and the video shapes.

Golden layout, derived by hand from transformers' Qwen2-VL processors (image ``patchify`` writes each patch as
``(C, T, p, p)`` with the image copied along ``T``; the video processor's puts frame ``2k`` at ``T = 0`` and
``2k + 1`` at ``T = 1``, temporal patch ``k`` after ``k - 1``). The kit's processor (patch 8, merge 2, T = 2,
CLIP mean/std, values / 255) makes a 32 x 32 frame a (4, 4) grid of 16 patches of 3 x 2 x 64 = 384 values. So a
video of constant frames A, B has grid (1, 4, 4) and every patch reshaped ``[3, 2, 64]`` holds
``(A_c / 255 - mean_c) / std_c`` at ``[c, 0]`` and B's at ``[c, 1]``; three frames A, B, C give grid (2, 4, 4):
temporal patch 1 is (C, C), the last frame repeated. Tokens: ``t * 4 * 4 / 2**2`` = 4 per temporal patch.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.errors import DataError
from roll.data.config import TokenizeConfig
from roll.data.media import attach_vision, place_vision_tokens
from roll.data.tasks import builtin_dataset, get_task, problems, split_of
from roll.data.tokenize import tokenize_dataset
from roll.data.video import VIDEO_SPAN, encode_videos, load_video, row_videos
from roll.data.vision import (
    IMAGE_SPAN,
    VIDEO_PAD,
    collate_videos,
    encode_images,
    vision_columns,
)

MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)
RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)
V = 8  # a video pad id in the id-level tests


@pytest.fixture(scope="module")
def image_processor() -> Any:
    from roll.data.tiny_vl import build_image_processor

    return build_image_processor("tiny-vl-1m")


def _frame(colour: tuple[int, int, int], size: tuple[int, int] = (32, 32)) -> Image.Image:
    return Image.new("RGB", size, colour)


def _noise(seed: int) -> Image.Image:
    g = torch.Generator().manual_seed(seed)
    return Image.fromarray(torch.randint(0, 256, (32, 32, 3), generator=g, dtype=torch.uint8).numpy())


def _normalized(colour: tuple[int, int, int]) -> torch.Tensor:
    return torch.tensor([(v / 255 - m) / s for v, m, s in zip(colour, MEAN, STD)])


def test_constant_frames_land_where_the_hand_derivation_says(image_processor: Any) -> None:
    pixels, grid = encode_videos([[_frame(RED), _frame(BLUE)]], image_processor)
    assert grid.tolist() == [[1, 4, 4]] and pixels.shape == (16, 384)
    cells = pixels.reshape(16, 3, 2, 64)
    torch.testing.assert_close(cells[:, :, 0], _normalized(RED)[None, :, None].expand(16, 3, 64))
    torch.testing.assert_close(cells[:, :, 1], _normalized(BLUE)[None, :, None].expand(16, 3, 64))
    odd, odd_grid = encode_videos([[_frame(RED), _frame(BLUE), _frame(GREEN)]], image_processor)
    assert odd_grid.tolist() == [[2, 4, 4]] and odd.shape == (32, 384)
    last = odd[16:].reshape(16, 3, 2, 64)  # temporal patch 1: the last frame twice
    for k in (0, 1):
        torch.testing.assert_close(last[:, :, k], _normalized(GREEN)[None, :, None].expand(16, 3, 64))
    torch.testing.assert_close(odd[:16], pixels)


def test_a_repeated_frame_is_its_image_encoding_and_frames_keep_their_patches(image_processor: Any) -> None:
    x, y = _noise(0), _noise(1)
    image_x, image_grid = encode_images([x], image_processor)
    video_xx, video_grid = encode_videos([[x, x]], image_processor)
    torch.testing.assert_close(video_xx, image_x, rtol=0, atol=0)
    assert video_grid.tolist() == image_grid.tolist() == [[1, 4, 4]]
    video_xy, _ = encode_videos([[x, y], [y]], image_processor)  # two videos; a one-frame video is (y, y)
    image_y, _ = encode_images([y], image_processor)
    xy = video_xy[:16].reshape(16, 3, 2, 64)
    torch.testing.assert_close(xy[:, :, 0], image_x.reshape(16, 3, 2, 64)[:, :, 0], rtol=0, atol=0)
    torch.testing.assert_close(xy[:, :, 1], image_y.reshape(16, 3, 2, 64)[:, :, 0], rtol=0, atol=0)
    torch.testing.assert_close(video_xy[16:], image_y, rtol=0, atol=0)


def test_videos_load_from_lists_folders_and_gifs(tmp_path: Path) -> None:
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, colour in enumerate((RED, GREEN, BLUE)):
        _frame(colour).save(folder / f"f{i}.png")
    (folder / "notes.txt").write_text("not a frame")
    gif = tmp_path / "clip.gif"
    _frame(RED).save(gif, save_all=True, append_images=[_frame(BLUE)], duration=100)
    for video, colours in [
        ([folder / "f0.png", _frame(GREEN)], [RED, GREEN]),
        (str(folder), [RED, GREEN, BLUE]),
        (gif, [RED, BLUE]),
    ]:
        frames = load_video(video)
        assert [f.getpixel((5, 5)) for f in frames] == colours
    assert row_videos({"videos": str(gif)}) == [str(gif)] and row_videos({"videos": None}) == []


def test_bad_videos_name_the_row_video_frame_and_file(tmp_path: Path) -> None:
    (tmp_path / "junk.png").write_bytes(b"not an image")
    with pytest.raises(
        DataError, match=r"row 3: videos\[1\].frames\[2\]: file .*junk.png.* not a readable image"
    ):
        load_video([_frame(RED), _frame(RED), str(tmp_path / "junk.png")], row=3, index=1)
    with pytest.raises(DataError, match=r"row 0: videos\[0\]: the video has no frames"):
        load_video([], row=0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"videos\[0\]: the video has no frames"):
        load_video(tmp_path / "empty")  # a folder without image files
    with pytest.raises(DataError, match=r"row 2: videos\[0\]: frame 1 is 48x32 but frame 0 is 32x32"):
        load_video([_frame(RED), _frame(RED, (48, 32))], row=2)
    with pytest.raises(DataError, match=r"videos\[0\]: video path .*nowhere.* does not exist"):
        load_video(str(tmp_path / "nowhere"))


def test_markers_place_video_spans_and_count_videos() -> None:
    msgs = [{"role": "user", "content": "Watch: <video> then <video>."}]
    placed = place_vision_tokens(msgs, {"videos": [[1], [2]]}, index=0)
    assert placed[0]["content"] == f"Watch: {VIDEO_SPAN} then {VIDEO_SPAN}."
    plain = [{"role": "system", "content": "s"}, {"role": "user", "content": "What moves?"}]
    both = place_vision_tokens(plain, {"videos": [[1]], "images": [_frame(RED)]})
    assert both[1]["content"] == IMAGE_SPAN + VIDEO_SPAN + "What moves?"  # images first, then videos
    with pytest.raises(
        DataError, match=r"row 7: the text has 2 <video> placeholder\(s\) but the row has 1 video"
    ):
        place_vision_tokens(msgs, {"videos": [[1]]}, index=7)
    with pytest.raises(
        DataError, match=r"row 4: the text has 2 <video> placeholder\(s\) but the row has 0 video"
    ):
        place_vision_tokens(msgs, {"videos": None}, index=4)  # the row's video removed
    assert place_vision_tokens(msgs, {})[0]["content"] == msgs[0]["content"]  # no videos column: plain text


def test_attach_expands_video_pads_and_a_removed_video_is_an_error(image_processor: Any) -> None:
    """Three 32 x 32 frames: grid (2, 4, 4), 2 * 16 / 4 = 8 video tokens; one image beside it: 4 image tokens."""
    P = 7
    video = [_frame(RED), _frame(GREEN), _frame(BLUE)]
    rows = [
        {"prompt_ids": [1, P, V, 2], "images": [_frame(RED)], "videos": [video]},
        {"input_ids": [1, V, 2, 3], "labels": [-100, -100, 2, 3], "videos": [video[:2]]},
    ]
    out = attach_vision(rows, image_processor, image_pad_id=P, video_pad_id=V)
    assert out[0]["prompt_ids"] == [1, *[P] * 4, *[V] * 8, 2] and out[0]["length"] == 14
    assert out[0][C.VIDEO_GRID_THW].tolist() == [[2, 4, 4]] and out[0][C.PIXEL_VALUES_VIDEOS].shape == (
        32,
        384,
    )
    assert out[1]["input_ids"] == [1, *[V] * 4, 2, 3] and out[1]["labels"] == [-100] * 5 + [2, 3]
    assert out[1][C.PIXEL_VALUES] is None and out[1][C.VIDEO_GRID_THW].tolist() == [[1, 4, 4]]
    with pytest.raises(DataError, match=r"eval: row 0 has video placeholder tokens but no videos"):
        attach_vision(
            [{**rows[0], "videos": None}], image_processor, image_pad_id=P, video_pad_id=V, source="eval"
        )
    with pytest.raises(
        DataError, match=r"row 0: the tokenized prompt has 1 video placeholder token.* 2 video"
    ):
        attach_vision(
            [{**rows[0], "videos": [video, video]}], image_processor, image_pad_id=P, video_pad_id=V
        )
    with pytest.raises(DataError, match=r"row 0 has videos but no video pad id"):
        attach_vision(rows, image_processor, image_pad_id=P)


def test_row_splits_keep_each_rows_video(image_processor: Any) -> None:
    colours = [RED, GREEN, BLUE, (255, 255, 0)]
    rows = [{"prompt_ids": [1, V], "videos": [[_frame(c), _frame(RED)]]} for c in colours]
    rows.insert(2, {"prompt_ids": [1, 2]})  # a text row between them
    encoded = attach_vision(rows, image_processor, image_pad_id=7, video_pad_id=V)
    batch = Batch({"x": torch.arange(5)}, vision_columns(encoded))
    parts = [*batch.split([2, 3]), batch.select(torch.tensor([4, 0])), *batch.chunk(5)]
    for part in parts:
        for i, row_id in enumerate(part.tensors["x"].tolist()):
            got = part.non_tensors[C.PIXEL_VALUES_VIDEOS][i]
            want = encoded[row_id][C.PIXEL_VALUES_VIDEOS]
            assert (got is None and want is None) or torch.equal(got, want)
    merged = collate_videos(batch.non_tensors[C.PIXEL_VALUES_VIDEOS], batch.non_tensors[C.VIDEO_GRID_THW])
    assert merged["pixel_values_videos"].shape == (4 * 16, 384) and merged["video_grid_thw"].shape == (4, 3)


@pytest.mark.parametrize("level", [4, 5])
def test_video_shapes_are_seeded_split_and_need_every_frame(level: int) -> None:
    a = builtin_dataset("builtin:shapes", "rl", 6, seed=1, options={"level": level})
    b = builtin_dataset("builtin:shapes", "rl", 6, seed=1, options={"level": level})
    assert a["prompt"] == b["prompt"] and a["ground_truth"] == b["ground_truth"]
    assert all(p.startswith("<video>") for p in a["prompt"])
    task = get_task("shapes", level=level)
    for p in problems(task, 30, seed=2):
        (frames,) = p.videos
        assert 2 <= len(frames) <= 4 and task.verify(task.format_answer(p.answer), p.ground_truth)
        seen = [_shape_pixels(f) for f in frames]
        if level == 4:
            assert seen[-1][0] == p.answer and all(x[0] != y[0] for x, y in itertools.pairwise(seen))
        else:
            (dx, dy) = (seen[-1][1] - seen[0][1], seen[-1][2] - seen[0][2])
            moved = {"left": -dx, "right": dx, "up": -dy, "down": dy}[p.answer]
            assert moved > 0 and len({x[0] for x in seen}) == 1
    train = {p.key for p in problems(task, 40, split="train")}
    held_out = {p.key for p in problems(task, 10, split="eval")}
    assert held_out and not train & held_out and all(split_of(k) == "eval" for k in held_out)


def _shape_pixels(frame: Image.Image) -> tuple[str, float, float]:
    """(colour name, mean x, mean y) of the non-black pixels of a one-shape frame."""
    from roll.data.tasks.visual import COLOURS

    names = {v: k for k, v in COLOURS.items()}
    lit = [(x, y) for x in range(32) for y in range(32) if frame.getpixel((x, y)) != (0, 0, 0)]
    (colour,) = {names[frame.getpixel(xy)] for xy in lit}
    return colour, sum(x for x, _ in lit) / len(lit), sum(y for _, y in lit) / len(lit)


def test_video_rows_tokenize_to_one_pad_then_expand(image_processor: Any) -> None:
    from roll.data.tokenizer import build_tokenizer

    tok = build_tokenizer("roll-tiny-vl")
    pad = tok.convert_tokens_to_ids(VIDEO_PAD)
    ds = builtin_dataset("builtin:shapes", "sft", 4, options={"level": 4})
    mapped, _ = tokenize_dataset(ds, kind="sft", tokenizer=tok, cfg=TokenizeConfig(max_length=256))
    rows = mapped.to_list()
    assert all(r["input_ids"].count(pad) == 1 for r in rows)
    out = attach_vision(
        rows, image_processor, image_pad_id=tok.convert_tokens_to_ids("<|image_pad|>"), video_pad_id=pad
    )
    for r, source in zip(out, ds):
        t = (len(source["videos"][0]) + 1) // 2
        assert r["input_ids"].count(pad) == 4 * t and r[C.VIDEO_GRID_THW].tolist() == [[t, 4, 4]]
        trained = [i for i, label in zip(r["input_ids"], r["labels"]) if label != -100]
        assert pad not in trained and tok.decode(trained).startswith("The answer is")
