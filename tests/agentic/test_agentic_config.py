"""The agentic config speaks the RL modes' one vocabulary: async generation under ``rollout``, reward
normalization and GiGPO under ``algorithm``. Keys of the older agentic layout are refused at load time with the
new path as hint; a config an older run saved still exports (upgraded, not refused)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from roll.agentic.pipeline.agentic import AgenticConfig
from roll.core.config.loader import dump_yaml, load_config, load_tree, validate
from roll.core.errors import ConfigError, ConfigIssue
from roll.pipelines.algorithms.presets import GiGPOConfig
from roll.pipelines.rlvr.config import RLVRConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GUESS = EXAMPLES / "agentic_guess.yaml"
LAKE = EXAMPLES / "agentic_frozen_lake.yaml"  # GiGPO in step mode


def _issues(path: Path, overrides: list[str], model: type = AgenticConfig) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides, model=model)
    return info.value.issues


def _with(tmp_path: Path, base: Path, **top: object) -> Path:
    """``base`` with top-level keys added, as a YAML file (the keys as a person would write them)."""
    data = yaml.safe_load(base.read_text(encoding="utf-8"))
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({**data, **top}, sort_keys=False), encoding="utf-8")
    return path


OLD_KEYS = {
    "async_generation_ratio": (1, "rollout.async_generation_ratio"),
    "reward_norm": ("group", "algorithm.reward_norm"),
    "gigpo": ({"step_weight": 0.5}, "algorithm.gigpo (with algorithm.adv_estimator: gigpo)"),
}


@pytest.mark.parametrize("old", sorted(OLD_KEYS))
def test_an_old_key_in_yaml_is_refused_naming_its_new_path(tmp_path: Path, old: str) -> None:
    value, new = OLD_KEYS[old]
    (issue,) = _issues(_with(tmp_path, GUESS, **{old: value}), [])
    assert (issue.path, issue.message, issue.hint) == (
        old,
        f"{old!r} is no longer a top-level key",
        f"move it to {new}",
    )
    assert issue.source is not None and "old.yaml:" in issue.source  # the line it was written at


@pytest.mark.parametrize("old", sorted(OLD_KEYS))
def test_an_old_key_as_override_is_refused_naming_its_new_path(old: str) -> None:
    value, new = OLD_KEYS[old]
    text = f"{old}={value}" if not isinstance(value, dict) else f"{old}.step_weight=0.5"
    (issue,) = _issues(GUESS, [text])
    assert (issue.path, issue.hint) == (old, f"move it to {new}")


def test_the_new_paths_load() -> None:
    config = load_config(
        LAKE,
        [
            "rollout.async_generation_ratio=1",
            "algorithm.reward_norm=group",
            "algorithm.gigpo.step_weight=0.5",
        ],
        model=AgenticConfig,
    )
    assert config.rollout.async_generation_ratio == 1
    assert config.algorithm.reward_norm == "group"
    assert config.algorithm.adv_estimator == "gigpo"
    assert config.algorithm.gigpo_settings == GiGPOConfig(step_weight=0.5, norm_by_std=True)
    plain = load_config(GUESS, [], model=AgenticConfig)
    assert plain.rollout.async_generation_ratio == 0 and plain.algorithm.gigpo is None
    assert plain.algorithm.gigpo_settings == GiGPOConfig()  # the defaults when adv_estimator: gigpo has none


def test_async_generation_is_sync_or_one_step_ahead() -> None:
    (issue,) = _issues(GUESS, ["rollout.async_generation_ratio=2"])
    assert issue.path == "rollout.async_generation_ratio" and "expected 0 | 1" in issue.message


def test_gigpo_settings_without_the_gigpo_estimator_are_refused() -> None:
    """``algorithm.gigpo`` moved from an old top-level ``gigpo`` but without ``adv_estimator: gigpo`` would run
    GRPO silently: refused, naming the estimator key."""
    (issue,) = _issues(GUESS, ["algorithm.gigpo={step_weight: 1.0}"])
    assert issue.path == "algorithm.gigpo"
    assert issue.message == "gigpo is set, but adv_estimator is 'grpo', so nothing reads it"
    assert issue.hint == "set adv_estimator: gigpo, or remove gigpo"


def test_gigpo_needs_step_mode() -> None:
    (issue,) = _issues(LAKE, ["env_manager.mode=trajectory"])
    assert (issue.path, issue.message) == (
        "algorithm.adv_estimator",
        "GiGPO's step-level groups need one sample per step",
    )


def test_rlvr_refuses_gigpo_and_its_settings() -> None:
    quickstart = EXAMPLES / "quickstart.yaml"
    (issue,) = _issues(quickstart, ["algorithm.adv_estimator=gigpo"], model=RLVRConfig)
    assert "advantage estimator 'gigpo' is not supported by the rlvr pipeline" in issue.message
    (issue,) = _issues(quickstart, ["algorithm.gigpo={step_weight: 1.0}"], model=RLVRConfig)
    assert issue.path == "algorithm.gigpo" and issue.hint == "set adv_estimator: gigpo, or remove gigpo"


def _old_saved(config: AgenticConfig, **old: object) -> dict[str, object]:
    """What an older roll saved for ``config``: every field dumped, with the old top-level keys beside them and
    the sampling keys in ``env_manager``."""
    data = yaml.safe_load(dump_yaml(config))
    rollout = data.pop("rollout")
    del rollout["async_generation_ratio"]
    data["env_manager"].update(rollout)  # the sampling keys were the env manager's
    data["algorithm"].pop("gigpo")
    return {**data, "async_generation_ratio": 0, "reward_norm": "none", "gigpo": None, **old}


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({}, []),
        (
            {
                "async_generation_ratio": 1,
                "reward_norm": "tag",
                "gigpo": {"step_weight": 0.5, "norm_by_std": False},
            },
            [
                "rollout.async_generation_ratio=1",
                "algorithm.reward_norm=tag",
                "algorithm.adv_estimator=gigpo",
                "algorithm.gigpo={step_weight: 0.5, norm_by_std: false}",
            ],
        ),
    ],
)
def test_a_config_an_older_run_saved_is_upgraded_for_export(
    tmp_path: Path, old: dict[str, object], new: list[str]
) -> None:
    """``roll export`` re-reads a run's saved config: one of the older layout (every key dumped, the moved ones
    among them) validates, through :meth:`AgenticConfig.upgrade_saved`, to the config of today's layout."""
    base = ["env_manager.mode=step"]
    expected = load_config(GUESS, [*base, *new], model=AgenticConfig)
    today = load_config(GUESS, base, model=AgenticConfig)
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(_old_saved(today, **old), sort_keys=False), encoding="utf-8")
    with pytest.raises(ConfigError, match="is no longer a top-level key"):
        validate(load_tree(saved), AgenticConfig)  # as a config a person passes: refused
    tree = load_tree(saved)
    upgraded = validate(type(tree)(AgenticConfig.upgrade_saved(tree.data), tree.sources), AgenticConfig)
    assert upgraded == expected
