"""rlvr takes video rows as it takes image rows: the example config with the video shapes validates, and the
prompts it would feed carry each row's frames (patches for the trainer, raw frames for vLLM) with their pads."""

from __future__ import annotations

from pathlib import Path

from roll.core import columns as C
from roll.core.config.loader import load_tree, validate
from roll.pipelines.rlvr import RLVRConfig

EXAMPLE = Path(__file__).parents[2] / "examples" / "vlm_rlvr_video.yaml"
SMALL = [  # the example's sources, fewer rows
    'data.sources=[{path: "builtin:shapes", builtin_kind: rl, max_samples: 8, builtin_options: {level: 4}}]',
    "data.eval_sources=[]",
]


def test_a_video_rlvr_config_validates_and_its_prompts_carry_the_frames() -> None:
    """Level 4 draws 2-4 frames of 32 x 32: ``t = ceil(frames / 2)`` temporal patches of 16 patches, 4 tokens each."""
    from roll.pipelines.common.data import load_image_processor_for, load_tokenizer, prepare_data
    from roll.pipelines.rlvr.data import IMAGE_COLUMNS, prompt_batch

    full = validate(load_tree(EXAMPLE, [], model=RLVRConfig), RLVRConfig)
    assert full.data.sources[0].builtin_options == {"level": 4} and full.policy_model.path == "tiny-vl-1m"
    cfg = validate(load_tree(EXAMPLE, SMALL, model=RLVRConfig), RLVRConfig)
    path = cfg.policy_model.path
    tokenizer = load_tokenizer(path)
    data = prepare_data(
        cfg.data,
        cfg.tokenize,
        kind="prompt",
        tokenizer=tokenizer,
        image_processor=load_image_processor_for(path),
    )
    pad = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    for row in data.train:
        t = (len(row[C.VIDEOS][0]) + 1) // 2
        assert row[C.VIDEO_GRID_THW].tolist() == [[t, 4, 4]] and row["prompt_ids"].count(pad) == 4 * t
        assert row[C.PIXEL_VALUES_VIDEOS].shape == (16 * t, 384) and row[C.PIXEL_VALUES] is None
    batch = prompt_batch(data.train[:3])
    assert set(IMAGE_COLUMNS) <= set(batch.non_tensors)  # what the samples carry from their prompts
    assert [len(v[0]) for v in batch.non_tensors[C.VIDEOS]] == [len(r[C.VIDEOS][0]) for r in data.train[:3]]
