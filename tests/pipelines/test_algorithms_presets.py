"""AlgorithmConfig presets: expected settings, overrides win, impossible combinations rejected by key."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from roll.core.config.validate import validate_data
from roll.core.errors import ConfigError
from roll.pipelines.algorithms.choices import PRESET_NAMES
from roll.pipelines.algorithms.presets import PRESETS, AlgorithmConfig, preset_config


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_preset_validates_and_applies(name: str) -> None:
    config = preset_config(name)  # type: ignore[arg-type]
    assert config.preset == name
    for key, value in PRESETS[name].items():
        assert getattr(config, key) == value


def test_expected_settings() -> None:
    ppo = preset_config("ppo")
    assert (ppo.adv_estimator, ppo.use_critic, ppo.kl_mode) == ("gae", True, "reward")
    grpo = preset_config("grpo")
    assert (grpo.kl_mode, grpo.kl_coef, grpo.loss_agg_mode) == ("loss", 0.04, "seq-mean-token-mean")
    dr = preset_config("dr_grpo")
    assert (dr.adv_estimator, dr.kl_mode, dr.loss_agg_mode) == ("dr_grpo", "none", "seq-mean-token-sum-norm")
    dapo = preset_config("dapo")
    assert (dapo.clip_low, dapo.clip_high, dapo.dynamic_sampling, dapo.overlong_penalty) == (
        0.2,
        0.28,
        True,
        True,
    )
    assert dapo.loss_agg_mode == "token-mean" and dapo.kl_mode == "none"
    gspo = preset_config("gspo")
    assert (gspo.loss_type, gspo.clip_low, gspo.clip_high) == ("gspo", 3e-4, 4e-4)
    assert preset_config("cispo").loss_type == "cispo"
    assert preset_config("topr").loss_type == "topr"
    assert preset_config("rloo").adv_estimator == "rloo"
    assert preset_config("reinforce_pp").kl_mode == "reward"
    assert preset_config("reinforce_pp_baseline").adv_estimator == "reinforce_pp_baseline"


def test_overrides_win() -> None:
    config = preset_config("dapo", clip_high=0.3, dynamic_sampling=False)
    assert (config.clip_high, config.dynamic_sampling, config.clip_low) == (0.3, False, 0.2)
    config = AlgorithmConfig.model_validate({"preset": "grpo", "kl_mode": "none"})
    assert config.kl_mode == "none" and config.kl_coef == 0.04  # unused, but not an impossible combination
    assert AlgorithmConfig().preset is None


def _issues(data: dict[str, object]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        validate_data(data, AlgorithmConfig)
    return {issue.path: issue.message for issue in info.value.issues}


def test_gae_without_critic() -> None:
    issues = _issues({"preset": "ppo", "use_critic": False})
    assert "critic" in issues["adv_estimator"]


def test_dual_clip_rules() -> None:
    assert "> 1" in _issues({"dual_clip_c": 1.0})["dual_clip_c"]
    assert "ppo" in _issues({"preset": "gspo", "dual_clip_c": 3.0})["dual_clip_c"]
    assert preset_config("ppo", dual_clip_c=3.0).dual_clip_c == 3.0


def test_kl_rules_and_all_issues_at_once() -> None:
    issues = _issues(
        {
            "kl_target": 6.0,
            "adv_estimator": "gae",
            "dynamic_sampling_min_std": 0.5,
            "dynamic_sampling_max_std": 0.1,
        }
    )
    assert set(issues) == {"kl_target", "adv_estimator", "dynamic_sampling_min_std"}
    assert "kl_coef" in _issues({"kl_mode": "loss"})


def test_strict_and_frozen() -> None:
    assert "preset" in _issues({"preset": "grpoo"})
    assert "clip_hi" in _issues({"clip_hi": 0.3})
    assert "clip_low" in _issues({"clip_low": 1.5})
    config = preset_config("grpo")
    with pytest.raises(ValidationError):
        config.clip_low = 0.1  # type: ignore[misc]


def test_group_size_check() -> None:
    issues = preset_config("dapo").check(1)
    assert len(issues) == 2 and all(i.path == "batch.samples_per_prompt" for i in issues)
    assert preset_config("ppo").check(1) == []
    assert preset_config("grpo").check(8) == []


def test_presets_import_no_torch() -> None:
    code = "import sys, roll.pipelines.algorithms.presets; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
