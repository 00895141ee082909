"""``agentic_rollout`` sizes its steps in the RL modes' one batch vocabulary: ``batch.prompts_per_step`` env groups
of ``batch.samples_per_prompt`` envs (agentic's and rlvr's paths). The older ``groups`` / ``group_size`` are
refused at load time, in YAML or as an override, with the new path as hint; the new keys load, with the old
defaults (8 groups of 1 env); BatchConfig's training keys are refused (a rollout trains nothing); a config an older
run saved is upgraded by ``upgrade_saved``. Everything goes through roll's loader as ``roll train`` calls it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from roll.agentic.pipeline.agentic_rollout import (
    MOVED_KEYS,
    TRAINING_BATCH_KEYS,
    AgenticRolloutConfig,
    RolloutBatchConfig,
)
from roll.core.cli import load_run_config
from roll.core.config.batch import BatchConfig
from roll.core.config.loader import dump_yaml, load_tree, validate
from roll.core.errors import ConfigError, ConfigIssue

BASE = {
    "pipeline": "agentic_rollout",
    "max_steps": 2,
    "env_manager": {"envs": [{"type": "guess_direction", "options": {"num_directions": 2}}]},
}
OLD = {"groups": (3, "batch.prompts_per_step"), "group_size": (2, "batch.samples_per_prompt")}


def _yaml(tmp_path: Path, **top: Any) -> Path:
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump({**BASE, **top}, sort_keys=False), encoding="utf-8")
    return path


def _line(path: Path, key: str) -> str:
    """``rollout.yaml:<n>``: where ``key:`` is written in ``path`` (1-based), as an issue's source ends."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return f"rollout.yaml:{next(i for i, line in enumerate(lines, 1) if line.strip().startswith(f'{key}:'))}"


def _load(path: Path, overrides: list[str]) -> AgenticRolloutConfig:
    _, config = load_run_config(path, overrides)
    assert isinstance(config, AgenticRolloutConfig)
    return config


def _issues(path: Path, overrides: list[str]) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as info:
        load_run_config(path, overrides)
    return info.value.issues


def test_the_moved_keys_are_the_old_fields() -> None:
    assert MOVED_KEYS == {"groups": "batch.prompts_per_step", "group_size": "batch.samples_per_prompt"}
    moved = AgenticRolloutConfig.moved_keys()
    assert {k: moved[k] for k in MOVED_KEYS} == MOVED_KEYS
    assert moved["env_manager.temperature"] == "rollout.temperature"  # the shared agentic moves stay
    assert not set(MOVED_KEYS) & set(AgenticRolloutConfig.model_fields)


@pytest.mark.parametrize("key", sorted(OLD))
def test_an_old_key_in_yaml_is_refused_naming_its_new_path(tmp_path: Path, key: str) -> None:
    value, new = OLD[key]
    path = _yaml(tmp_path, **{key: value})
    (issue,) = _issues(path, [])
    assert (issue.path, issue.message, issue.hint) == (
        key,
        f"'{key}' is no longer a top-level key",
        f"move it to {new}",
    )
    assert issue.source is not None and issue.source.endswith(_line(path, key))


@pytest.mark.parametrize("key", sorted(OLD))
def test_an_old_key_as_override_is_refused_naming_its_new_path(tmp_path: Path, key: str) -> None:
    value, new = OLD[key]
    (issue,) = _issues(_yaml(tmp_path), [f"{key}={value}"])
    assert (issue.path, issue.hint, issue.source) == (
        key,
        f"move it to {new}",
        f"<override 1: {key}={value}>",
    )


def test_both_old_keys_are_reported_at_once(tmp_path: Path) -> None:
    issues = _issues(_yaml(tmp_path, groups=3, group_size=2), [])
    assert sorted((i.path, i.hint) for i in issues) == [
        ("group_size", "move it to batch.samples_per_prompt"),
        ("groups", "move it to batch.prompts_per_step"),
    ]


def test_the_new_keys_load_from_yaml_and_overrides(tmp_path: Path) -> None:
    config = _load(_yaml(tmp_path, batch={"prompts_per_step": 3, "samples_per_prompt": 2}), [])
    assert (config.batch.prompts_per_step, config.batch.samples_per_prompt) == (3, 2)
    config = _load(_yaml(tmp_path), ["batch.prompts_per_step=5", "batch.samples_per_prompt=4"])
    assert (config.batch.prompts_per_step, config.batch.samples_per_prompt) == (5, 4)
    config = _load(_yaml(tmp_path, batch={"prompts_per_step": 3}), ["batch.samples_per_prompt=2"])
    assert (config.batch.prompts_per_step, config.batch.samples_per_prompt) == (3, 2)


def test_the_new_keys_default_to_the_old_defaults(tmp_path: Path) -> None:
    """``groups`` defaulted to 8, ``group_size`` to 1: a step played 8 env groups of one env each."""
    config = _load(_yaml(tmp_path), [])
    assert config.batch.model_dump() == {"prompts_per_step": 8, "samples_per_prompt": 1}
    assert AgenticRolloutConfig().batch == RolloutBatchConfig(prompts_per_step=8, samples_per_prompt=1)


@pytest.mark.parametrize("value", [0, -1])
def test_the_new_keys_keep_the_old_bounds(tmp_path: Path, value: int) -> None:
    issues = _issues(
        _yaml(tmp_path), [f"batch.prompts_per_step={value}", f"batch.samples_per_prompt={value}"]
    )
    assert sorted(i.path for i in issues) == ["batch.prompts_per_step", "batch.samples_per_prompt"]
    assert all("greater than or equal to 1" in i.message for i in issues)


def test_the_training_keys_are_the_rest_of_batch_config() -> None:
    """Every BatchConfig key is either accepted here or refused with the rollout's own message."""
    assert set(TRAINING_BATCH_KEYS) == {
        "samples_per_optimizer_step",
        "micro_batch_samples",
        "micro_batch_tokens",
    }
    assert set(TRAINING_BATCH_KEYS) | set(RolloutBatchConfig.model_fields) == set(BatchConfig.model_fields)


@pytest.mark.parametrize("key", sorted(TRAINING_BATCH_KEYS))
def test_a_training_batch_key_is_refused_in_yaml_and_as_override(tmp_path: Path, key: str) -> None:
    message = f"batch.{key} sizes training steps; agentic_rollout trains nothing"
    hint = (
        "remove it: an agentic_rollout batch takes only batch.prompts_per_step and batch.samples_per_prompt"
    )
    path = _yaml(tmp_path, batch={"prompts_per_step": 4, key: 8})
    (issue,) = _issues(path, [])
    assert (issue.path, issue.message, issue.hint) == (f"batch.{key}", message, hint)
    assert issue.source is not None and issue.source.endswith(_line(path, key))
    (issue,) = _issues(_yaml(tmp_path), [f"+batch.{key}=8"])
    assert (issue.path, issue.message, issue.hint) == (f"batch.{key}", message, hint)


def test_an_unknown_batch_key_gets_a_did_you_mean(tmp_path: Path) -> None:
    (issue,) = _issues(_yaml(tmp_path, batch={"prompt_per_step": 4}), [])
    assert (issue.path, issue.message, issue.hint) == (
        "batch.prompt_per_step",
        "unknown key 'prompt_per_step'",
        "did you mean 'prompts_per_step'?",
    )


def test_a_typo_is_reported_beside_a_training_key_not_after_it_is_fixed(tmp_path: Path) -> None:
    path = _yaml(tmp_path, batch={"micro_batch_samples": 4, "prompt_per_step": 4, "zzz": 1})
    issues = {issue.path: issue for issue in _issues(path, [])}
    assert sorted(issues) == ["batch.micro_batch_samples", "batch.prompt_per_step", "batch.zzz"]
    assert issues["batch.micro_batch_samples"].message.endswith("agentic_rollout trains nothing")
    typo = issues["batch.prompt_per_step"]
    assert (typo.message, typo.hint) == ("unknown key 'prompt_per_step'", "did you mean 'prompts_per_step'?")
    assert typo.source is not None and typo.source.endswith(_line(path, "prompt_per_step"))
    assert issues["batch.zzz"].hint == "allowed keys here: prompts_per_step, samples_per_prompt"


def _saved_old(config: AgenticRolloutConfig) -> dict[str, Any]:
    """What an older roll saved for ``config``: every field dumped, ``groups`` / ``group_size`` at the top and the
    sampling keys in ``env_manager``."""
    data = yaml.safe_load(dump_yaml(config))
    batch = data.pop("batch")
    data["groups"], data["group_size"] = batch["prompts_per_step"], batch["samples_per_prompt"]
    data["env_manager"].update(data.pop("rollout"))
    return data


def test_a_config_an_older_run_saved_is_upgraded(tmp_path: Path) -> None:
    expected = _load(
        _yaml(tmp_path),
        ["batch.prompts_per_step=3", "batch.samples_per_prompt=2", "rollout.temperature=0.5"],
    )
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(_saved_old(expected), sort_keys=False), encoding="utf-8")
    with pytest.raises(ConfigError, match="is no longer a top-level key"):
        validate(load_tree(saved), AgenticRolloutConfig)  # as a config a person passes: refused
    tree = load_tree(saved)
    upgraded = validate(
        type(tree)(AgenticRolloutConfig.upgrade_saved(tree.data), tree.sources), AgenticRolloutConfig
    )
    assert upgraded == expected
    assert AgenticRolloutConfig.upgrade_saved({"groups": 3, "batch": {"prompts_per_step": 5}}) == {
        "batch": {"prompts_per_step": 5}
    }  # a key batch already holds wins (as upgrade_sampling keeps rollout's)
    assert AgenticRolloutConfig.upgrade_saved({"seed": 1}) == {"seed": 1}  # today's layout: unchanged
