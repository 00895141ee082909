"""The curriculum prompt feed: pools per level of the built-in arithmetic task, switched by accuracy.

The real offline tokenizer and task; no model, no Ray. About 2 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.core.config.loader import load_tree, validate
from roll.core.errors import ConfigError
from roll.data.config import DatasetSourceConfig, TokenizeConfig
from roll.data.procedural import AccuracyCurriculum
from roll.data.tokenizer import build_tokenizer
from roll.pipelines.curriculum import CurriculumFeeder, at_level, level_rows
from roll.pipelines.rlvr import RLVRConfig

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"


def test_feed_moves_to_harder_prompts_when_accuracy_passes() -> None:
    """Level 0 is one-digit sums ("a+b"), level 2 has more operators: prompts change once mean accuracy over a
    window of 2 reaches 0.5, and a restored feeder continues identically."""
    src = DatasetSourceConfig(path="builtin:arithmetic", builtin_kind="rl", max_samples=16)
    assert at_level(src, 2).builtin_options == {"level": 2}
    pools = level_rows(src, 3, tokenize=TokenizeConfig(max_length=128), tokenizer=build_tokenizer(), seed=0)
    prompts = [{r["prompt"] for r in pool} for pool in pools]
    assert all(len(p) == 16 for p in prompts) and prompts[0].isdisjoint(prompts[2])
    feeder = CurriculumFeeder(pools, AccuracyCurriculum(max_level=2, threshold=0.5, window=2), seed=0)
    assert set(feeder(4)["prompt"]) <= prompts[0]
    assert feeder.observe(0.2) == 0 and feeder.observe(0.9) == 1  # mean 0.55
    assert set(feeder(4)["prompt"]) <= prompts[1]
    saved = feeder.state()
    again = CurriculumFeeder(pools, AccuracyCurriculum(max_level=2, threshold=0.5, window=2), seed=0)
    again.load_state(saved)
    assert again.level == 1 and list(again(5)["prompt"]) == list(feeder(5)["prompt"])


def _rlvr_config(overrides: list[str]) -> RLVRConfig:
    return validate(load_tree(QUICKSTART, overrides, model=RLVRConfig), RLVRConfig)


CURRICULUM = ["curriculum={levels: 3, threshold: 0.5, window: 2}", "data.sources.0.builtin_options={}"]


def test_curriculum_config_is_checked_with_key_paths() -> None:
    """One generated source with no level of its own; the start inside the levels; all problems at once."""
    assert _rlvr_config(CURRICULUM).curriculum is not None
    with pytest.raises(ConfigError) as err:
        _rlvr_config(["curriculum={levels: 2, start: 2}", "data.sources.0.builtin_options={level: 0}"])
    text = str(err.value)
    assert "curriculum.start" in text and "data.sources.0.builtin_options.level" in text
    # the quickstart's own explicit options conflict with the levels too
    with pytest.raises(ConfigError) as err:
        _rlvr_config(["curriculum={levels: 2}", "data.sources.0.builtin_options={digits: 1, num_ops: 2}"])
    assert "builtin_options.digits" in str(err.value) and "builtin_options.num_ops" in str(err.value)
    with pytest.raises(ConfigError, match=r"data.sources.0.path .*'data/x.jsonl' is not generated"):
        _rlvr_config([*CURRICULUM, "data.sources.0={path: data/x.jsonl}"])
    with pytest.raises(ConfigError, match=r"data\.sources has 2"):
        _rlvr_config([*CURRICULUM, "data.sources=[{path: a.jsonl}, {path: b.jsonl}]"])
