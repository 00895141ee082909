"""rlvr_rollout speaks rlvr's key paths: ``rollout.{max_new_tokens,temperature,top_p,request_prompts}`` and
``batch.samples_per_prompt``. Its old top-level keys are refused at load time, in YAML or as an override, with the
new path as hint; the new paths load and reach the config the pipeline reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from roll.core.config.loader import load_config
from roll.core.errors import ConfigError
from roll.pipelines.rlvr_rollout import RolloutEvalConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rlvr_rollout.yaml"
OLD = {
    "samples": (4, "batch.samples_per_prompt"),
    "temperature": (1.0, "rollout.temperature"),
    "top_p": (0.9, "rollout.top_p"),
    "max_new_tokens": (12, "rollout.max_new_tokens"),
    "request_prompts": (2, "rollout.request_prompts"),
}


@pytest.mark.parametrize("old", sorted(OLD))
def test_an_old_key_in_yaml_is_refused_naming_its_new_path(tmp_path: Path, old: str) -> None:
    value, new = OLD[old]
    data = {**yaml.safe_load(EXAMPLE.read_text(encoding="utf-8")), old: value}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, [], model=RolloutEvalConfig)
    (issue,) = info.value.issues
    assert (issue.path, issue.message, issue.hint) == (
        old,
        f"{old!r} is no longer a top-level key",
        f"move it to {new}",
    )
    assert issue.source is not None and "old.yaml:" in issue.source


@pytest.mark.parametrize("old", sorted(OLD))
def test_an_old_key_as_override_is_refused_naming_its_new_path(old: str) -> None:
    value, new = OLD[old]
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLE, [f"{old}={value}"], model=RolloutEvalConfig)
    (issue,) = info.value.issues
    assert (issue.path, issue.hint) == (old, f"move it to {new}")


def test_the_new_paths_load() -> None:
    overrides = [f"{new}={value}" for value, new in OLD.values()]
    config = load_config(EXAMPLE, overrides, model=RolloutEvalConfig)
    r = config.rollout
    assert config.batch.samples_per_prompt == 4
    assert (r.temperature, r.top_p, r.max_new_tokens, r.request_prompts) == (1.0, 0.9, 12, 2)


def test_defaults_are_unchanged() -> None:
    """Greedy, one answer of at most 64 tokens per prompt, 8 prompts a request: the old top-level defaults."""
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    for key in ("batch", "rollout", "pass_k"):
        del data[key]
    plain = RolloutEvalConfig.model_validate(data)
    assert plain.batch.samples_per_prompt == 1
    assert plain.rollout.model_dump() == {
        "max_new_tokens": 64,
        "temperature": 0.0,
        "top_p": 1.0,
        "request_prompts": 8,
    }
