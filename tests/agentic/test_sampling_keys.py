"""Sampling speaks the RL modes' one vocabulary in the agentic modes: ``rollout.max_new_tokens``,
``rollout.temperature``, ``rollout.top_p`` (rlvr's paths). The env manager's and the gateway's old keys are
refused at load time, written in YAML or as an override, with the new path as hint; a config an older run saved
is upgraded for ``roll export``; the values reach the env manager and the gateway from the new place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from roll.agentic.gateway.config import GatewaySamplingConfig
from roll.agentic.pipeline.agent_gateway import AgentGatewayConfig
from roll.agentic.pipeline.agentic import AgenticConfig
from roll.agentic.pipeline.agentic_rollout import AgenticRolloutConfig
from roll.core.config.loader import dump_yaml, load_config, load_tree, validate
from roll.core.errors import ConfigError, ConfigIssue

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GUESS = EXAMPLES / "agentic_guess.yaml"
GATEWAY = EXAMPLES / "agent_gateway_lookup.yaml"
OLD = {"max_new_tokens": 20, "temperature": 0.5, "top_p": 0.9}


def _rollout_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "rollout.yaml"
    path.write_text("pipeline: agentic_rollout\n", encoding="utf-8")
    return path


def _modes(tmp_path: Path) -> list[tuple[type, Path, str]]:
    """(config model, a config of it, the section that held its sampling keys)."""
    return [
        (AgenticConfig, GUESS, "env_manager"),
        (AgenticRolloutConfig, _rollout_yaml(tmp_path), "env_manager"),
        (AgentGatewayConfig, GATEWAY, "gateway"),
    ]


def _issues(path: Path, overrides: list[str], model: type) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides, model=model)
    return info.value.issues


@pytest.mark.parametrize("mode", range(3))
@pytest.mark.parametrize("key", sorted(OLD))
def test_an_old_sampling_key_in_yaml_is_refused_naming_its_new_path(
    tmp_path: Path, mode: int, key: str
) -> None:
    model, base, section = _modes(tmp_path)[mode]
    data = yaml.safe_load(base.read_text(encoding="utf-8"))
    data.setdefault(section, {})[key] = OLD[key]
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    (issue,) = _issues(path, [], model)
    assert (issue.path, issue.message, issue.hint) == (
        f"{section}.{key}",
        f"'{section}.{key}' is no longer a key of {section}",
        f"move it to rollout.{key}",
    )
    assert issue.source is not None and "old.yaml:" in issue.source


@pytest.mark.parametrize("mode", range(3))
@pytest.mark.parametrize("key", sorted(OLD))
def test_an_old_sampling_key_as_override_is_refused_naming_its_new_path(
    tmp_path: Path, mode: int, key: str
) -> None:
    model, base, section = _modes(tmp_path)[mode]
    (issue,) = _issues(base, [f"{section}.{key}={OLD[key]}"], model)
    assert (issue.path, issue.hint) == (f"{section}.{key}", f"move it to rollout.{key}")


@pytest.mark.parametrize("mode", range(3))
def test_the_new_paths_load(tmp_path: Path, mode: int) -> None:
    model, base, _ = _modes(tmp_path)[mode]
    config = load_config(base, [f"rollout.{k}={v}" for k, v in OLD.items()], model=model)
    assert (config.rollout.max_new_tokens, config.rollout.temperature, config.rollout.top_p) == (20, 0.5, 0.9)


def test_defaults_are_the_old_sections_defaults() -> None:
    """Behaviour is unchanged: env turns default to 32 tokens, gateway calls to 64; both at temperature 1.0,
    top_p 1.0 (the defaults env_manager and gateway had)."""
    assert AgenticConfig().rollout.model_dump(include=set(OLD)) == {
        "max_new_tokens": 32,
        "temperature": 1.0,
        "top_p": 1.0,
    }
    assert AgenticRolloutConfig().rollout.model_dump() == {
        "max_new_tokens": 32,
        "temperature": 1.0,
        "top_p": 1.0,
    }
    assert GatewaySamplingConfig().model_dump() == {"max_new_tokens": 64, "temperature": 1.0, "top_p": 1.0}


def _saved_old(config: Any, section: str) -> dict[str, Any]:
    """What an older roll saved for ``config``: every field dumped, the sampling keys in ``section``."""
    data = yaml.safe_load(dump_yaml(config))
    rollout = data["rollout"]
    for key in OLD:
        data[section][key] = rollout.pop(key)
    if not rollout:
        del data["rollout"]
    return data


@pytest.mark.parametrize(
    ("model", "base", "section"),
    [(AgenticConfig, GUESS, "env_manager"), (AgentGatewayConfig, GATEWAY, "gateway")],
)
def test_a_config_an_older_run_saved_is_upgraded_for_export(
    tmp_path: Path, model: Any, base: Path, section: str
) -> None:
    """``roll export`` reads a run's saved config through ``upgrade_saved``: the old layout (sampling keys in
    ``section``) validates to the config of today's layout with the same values."""
    expected = load_config(base, [f"rollout.{k}={v}" for k, v in OLD.items()], model=model)
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(_saved_old(expected, section), sort_keys=False), encoding="utf-8")
    with pytest.raises(ConfigError, match=f"is no longer a key of {section}"):
        validate(load_tree(saved), model)  # as a config a person passes: refused
    tree = load_tree(saved)
    upgraded = validate(type(tree)(model.upgrade_saved(tree.data), tree.sources), model)
    assert upgraded == expected
