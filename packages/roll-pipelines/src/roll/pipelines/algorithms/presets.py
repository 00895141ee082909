"""``AlgorithmConfig``: every algorithmic choice of an RL run, and named presets that fill them.

A preset is a set of defaults, not a mode: ``{"preset": "dapo", "clip_high": 0.3}`` is DAPO with a wider upper
clip. A ``model_validator(mode="before")`` merges the preset's values *under* the keys the user gave (explicit
keys always win); keys neither gives take the field defaults. After the merge the config is validated as one
unit, so impossible combinations are reported whether they came from the preset, the user, or both.

Preset values follow the papers where they state them and are marked as starting points where they do not.
Torch-free: ``roll validate`` loads this in milliseconds.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, model_validator

from roll.core.config.base import RollModel
from roll.core.config.validate import issues_error
from roll.core.errors import ConfigIssue
from roll.pipelines.algorithms.choices import (
    PRESET_NAMES,
    AdvEstimator,
    KLEstimator,
    KLMode,
    LossAggMode,
    MismatchCorrectionType,
    PolicyLossType,
    PresetName,
    RatioLevel,
    RewardNorm,
)
from roll.pipelines.algorithms.registry import ESTIMATORS, POLICY_LOSSES

#: Preset name -> the field values it sets. Everything not listed takes the field default.
PRESETS: dict[str, dict[str, Any]] = {
    # PPO with a critic and GAE (Ouyang et al. 2022 style: KL to the reference in the reward).
    "ppo": {
        "adv_estimator": "gae",
        "use_critic": True,
        "whiten_advantages": True,
        "loss_type": "ppo",
        "kl_mode": "reward",
        "kl_estimator": "k1",
        "kl_coef": 0.001,
    },
    # GRPO (Shao et al. 2024): group-normalized outcome advantage, k3 KL in the loss with beta = 0.04,
    # per-sequence mean of per-token means.
    "grpo": {
        "adv_estimator": "grpo",
        "kl_mode": "loss",
        "kl_estimator": "low_var_kl",
        "kl_coef": 0.04,
        "loss_agg_mode": "seq-mean-token-mean",
    },
    # Dr. GRPO (Liu et al. 2025): no std division, no per-response length normalization, no KL.
    "dr_grpo": {"adv_estimator": "dr_grpo", "loss_agg_mode": "seq-mean-token-sum-norm"},
    # RLOO (Ahmadian et al. 2024): leave-one-out baseline, KL in the reward.
    "rloo": {"adv_estimator": "rloo", "kl_mode": "reward", "kl_estimator": "k1", "kl_coef": 0.01},
    # REINFORCE++ (Hu 2025): token-level KL in the reward, discounted returns, batch whitening.
    "reinforce_pp": {
        "adv_estimator": "reinforce_pp",
        "kl_mode": "reward",
        "kl_estimator": "k1",
        "kl_coef": 0.01,
    },
    # REINFORCE++-baseline: group-mean baseline, batch whitening, KL in the loss (k2).
    "reinforce_pp_baseline": {
        "adv_estimator": "reinforce_pp_baseline",
        "kl_mode": "loss",
        "kl_estimator": "k2",
        "kl_coef": 0.01,
    },
    # GSPO (Zheng et al. 2025): sequence-level ratio with the paper's clip ranges 3e-4 / 4e-4.
    "gspo": {
        "adv_estimator": "grpo",
        "loss_type": "gspo",
        "clip_low": 3e-4,
        "clip_high": 4e-4,
        "loss_agg_mode": "seq-mean-token-mean",
    },
    # DAPO (Yu et al. 2025): clip-higher 0.2 / 0.28, token-level loss, dynamic sampling, soft overlong
    # punishment, no KL.
    "dapo": {
        "adv_estimator": "grpo",
        "clip_low": 0.2,
        "clip_high": 0.28,
        "loss_agg_mode": "token-mean",
        "dynamic_sampling": True,
        "overlong_penalty": True,
    },
    # TOPR (Le Roux et al. 2025): no clipping (the ratio truncation is built into the loss), no KL.
    "topr": {"adv_estimator": "grpo", "loss_type": "topr"},
    # CISPO (MiniMax-M1 2025): clipped IS weight, no lower bound; upper bound is a starting point.
    "cispo": {"adv_estimator": "grpo", "loss_type": "cispo", "clip_low": 1.0, "clip_high": 0.28},
}


class MismatchCorrection(RollModel):
    """How the policy loss corrects for the train/infer mismatch (``rho = pi_old / pi_infer`` per token, see
    :mod:`roll.pipelines.algorithms.mismatch`): ``tis`` truncates the weight at ``high``; ``mis`` keeps ``rho``
    inside ``[low, high]`` and drops the token (or, at sequence level, the sequence) outside; ``icepop`` masks
    tokens outside ``[low, high]`` with no reweighting."""

    type: MismatchCorrectionType = Field(description="tis, mis or icepop (registry MISMATCH_CORRECTIONS)")
    level: RatioLevel = Field(
        "token", description="token ratio, or the sequence ratio exp(sum of token log-ratios); icepop: token"
    )
    low: float | None = Field(
        None, gt=0, le=1, description="mis/icepop lower bound on rho; None: 1 / high (tis has none)"
    )
    high: float = Field(2.0, gt=0, description="tis cap; mis/icepop upper bound on rho (>= 1)")

    @property
    def lower(self) -> float:
        """The lower bound in use: ``low``, else ``1 / high``."""
        return self.low if self.low is not None else 1.0 / self.high

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        issues = []
        if self.type == "tis" and self.low is not None:
            message = "tis truncates the weight from above only; low applies to mis and icepop"
            issues.append(ConfigIssue("low", message, "remove low, or use type: mis"))
        if self.type != "tis" and self.high < 1:
            message = f"{self.type} accepts rho in [low, high], which must hold rho = 1; high is {self.high}"
            issues.append(ConfigIssue("high", message, "set high >= 1 (2 to 5 is usual)"))
        if self.type == "icepop" and self.level != "token":
            message = "icepop is a token mask; a sequence-level mask is mis with level: sequence"
            issues.append(ConfigIssue("level", message, "use level: token, or type: mis"))
        if issues:
            raise issues_error(issues, title=type(self).__name__)
        return self


class GiGPOConfig(RollModel):
    """GiGPO (Feng et al. 2025): ``A = A_episode + step_weight * A_step``; read when ``adv_estimator: gigpo``
    (agentic, with ``env_manager.mode: step``)."""

    step_weight: float = Field(1.0, ge=0, description="weight of the step-level (anchor state) advantage")
    norm_by_std: bool = Field(True, description="divide both advantages by their group's std (GRPO style)")


#: Keys read by some policy losses only (``dual_clip_c`` has its own check).
_LOSS_KEYS: dict[str, tuple[str, ...]] = {
    "topr_level": ("topr",),
    "sapo_tau_pos": ("sapo",),
    "sapo_tau_neg": ("sapo",),
    "cov_ratio": ("clip_cov", "kl_cov"),
    "clip_cov_lb": ("clip_cov",),
    "clip_cov_ub": ("clip_cov",),
    "kl_cov_coef": ("kl_cov",),
}


class AlgorithmConfig(RollModel):
    """The algorithm of an RL run: advantage estimator, policy loss and their hyperparameters.

    Set ``preset`` for a named algorithm (see :data:`PRESETS`) and override any field beside it.
    """

    preset: PresetName | None = Field(None, description="named defaults; explicit keys override them")
    # Advantages
    adv_estimator: AdvEstimator = Field(
        "grpo",
        description="advantage estimator (gae needs use_critic; group ones need samples_per_prompt >= 2)",
    )
    use_critic: bool = Field(False, description="train a critic; GAE needs its values")
    gamma: float = Field(1.0, ge=0, le=1, description="discount (GAE, REINFORCE++)")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    whiten_advantages: bool = Field(False, description="whiten GAE advantages over the batch's tokens")
    gigpo: GiGPOConfig | None = Field(
        None, description="adv_estimator=gigpo: its step weight and std normalization; unset: their defaults"
    )
    reward_norm: RewardNorm = Field("none", description="none, batch, group, tag or running (see choices)")
    reward_clip: float | None = Field(None, gt=0, description="clamp rewards into [-x, x]")
    advantage_clip: float | None = Field(None, gt=0, description="clamp advantages into [-x, x]")
    # Policy loss
    loss_type: PolicyLossType = Field(
        "ppo",
        description="policy loss: ppo (clipped), gspo (sequence ratio), cispo (clipped IS weight), topr, sapo "
        "(soft gate), gmpo (geometric mean), clip_cov, kl_cov (covariance-selected tokens)",
    )
    clip_low: float = Field(0.2, ge=0, le=1, description="ratio lower bound 1 - clip_low")
    clip_high: float = Field(0.2, ge=0, description="ratio upper bound 1 + clip_high (DAPO clip-higher)")
    dual_clip_c: float | None = Field(None, description="PPO dual-clip ratio bound for A < 0; must be > 1")
    topr_level: RatioLevel = Field("sequence", description="loss_type=topr: ratio per token or per sequence")
    sapo_tau_pos: float = Field(1.0, gt=0, description="loss_type=sapo: gate temperature for A > 0")
    sapo_tau_neg: float = Field(1.05, gt=0, description="loss_type=sapo: gate temperature for A <= 0")
    cov_ratio: float = Field(
        2e-4, gt=0, le=1, description="clip_cov / kl_cov: fraction of a micro-batch's tokens acted on"
    )
    clip_cov_lb: float = Field(1.0, description="clip_cov: lower covariance bound of the candidates")
    clip_cov_ub: float = Field(5.0, description="clip_cov: upper covariance bound of the candidates")
    kl_cov_coef: float = Field(0.1, ge=0, description="kl_cov: coefficient of the |log ratio| penalty")
    loss_agg_mode: LossAggMode = Field(
        "token-mean",
        description="how per-token losses reduce to one number: over all tokens or per sequence first",
    )
    loss_agg_norm_len: int | None = Field(
        None, gt=0, description="Dr. GRPO's constant; None: the rollout's max new tokens"
    )
    entropy_coef: float = Field(0.0, ge=0, description="weight of the entropy bonus in the loss; 0: none")
    skip_zero_advantage: bool = Field(
        True,
        description="leave rows whose advantages are all 0 out of the training forward when their gradient is "
        "exactly 0 (no KL loss, no entropy bonus); the update is the same, only entropy/clip metrics then cover "
        "the trained rows alone",
    )
    value_clip: float | None = Field(0.2, gt=0, description="critic value clipping range")
    # KL to the reference policy
    kl_mode: KLMode = Field(
        "none",
        description="KL to the reference: none, as a reward penalty, or as a loss term (needs a reference)",
    )
    kl_estimator: KLEstimator = Field(
        "low_var_kl", description="per-token KL estimator (k1, k2, k3, low_var_kl, ...)"
    )
    kl_coef: float = Field(0.0, ge=0, description="fixed coefficient, or the adaptive controller's start")
    kl_target: float | None = Field(
        None, gt=0, description="adaptive KL target (Ziegler et al.); None: fixed"
    )
    kl_horizon: int = Field(10000, gt=0, description="adaptive KL horizon")
    # Sample shaping (DAPO)
    dynamic_sampling: bool = Field(
        False,
        description="DAPO: drop groups whose rewards are all equal and sample more prompts to fill the step",
    )
    dynamic_sampling_min_std: float = Field(
        0.0, ge=0, description="dynamic sampling: keep only groups whose reward std is at least this"
    )
    dynamic_sampling_max_std: float | None = Field(
        None,
        gt=0,
        description="dynamic sampling: keep only groups whose reward std is at most this; None: no bound",
    )
    overlong_filter: bool = Field(False, description="mask out truncated samples")
    overlong_penalty: bool = Field(False, description="soft overlong punishment")
    overlong_cache_len: int | None = Field(
        None, gt=0, description="None: 20% of max new tokens (DAPO's ratio)"
    )
    overlong_penalty_factor: float = Field(1.0, ge=0, description="the soft overlong penalty at max length")
    # Train/infer mismatch
    tis_cap: float | None = Field(None, gt=0, description="truncated IS cap C; None: no correction")
    tis_level: RatioLevel = Field("token", description="truncated IS weights per token or per sequence")
    mismatch_correction: MismatchCorrection | None = Field(
        None, description="tis, mis or icepop with its bounds; tis_cap C is short for {type: tis, high: C}"
    )

    @model_validator(mode="before")
    @classmethod
    def _merge_preset(cls, data: Any) -> Any:
        """Preset values under the given keys, then the loss's :attr:`Entry.defaults` (and its required
        aggregation) under both: ``loss_type: gspo`` alone gets GSPO's clip ranges and ``seq-mean-token-mean``."""
        if not isinstance(data, dict):
            return data
        if data.get("preset") in PRESETS:
            data = {**PRESETS[data["preset"]], **data}
        # an unknown preset or loss name fails its Literal check, which lists the known ones
        loss = data.get("loss_type", "ppo")
        if loss in POLICY_LOSSES.names:
            entry = POLICY_LOSSES.entry(loss)
            needed = {} if entry.aggregation is None else {"loss_agg_mode": entry.aggregation}
            data = {**needed, **entry.defaults, **data}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        issues = self._advantage_issues() + self._loss_issues() + self._kl_issues() + self._sampling_issues()
        if issues:
            raise issues_error(issues, title=type(self).__name__)
        return self

    @property
    def gigpo_settings(self) -> GiGPOConfig:
        """GiGPO's settings in use: ``gigpo``, else its defaults."""
        return self.gigpo if self.gigpo is not None else GiGPOConfig()

    def _advantage_issues(self) -> list[ConfigIssue]:
        if self.gigpo is not None and self.adv_estimator != "gigpo":
            message = f"gigpo is set, but adv_estimator is {self.adv_estimator!r}, so nothing reads it"
            return [ConfigIssue("gigpo", message, "set adv_estimator: gigpo, or remove gigpo")]
        if self.adv_estimator == "gae" and not self.use_critic:
            return [
                ConfigIssue(
                    "adv_estimator",
                    "adv_estimator='gae' needs critic values, but use_critic is false",
                    "set use_critic=true, or pick a critic-free estimator (grpo, rloo, reinforce_pp, ...)",
                )
            ]
        return []

    def _loss_issues(self) -> list[ConfigIssue]:
        issues = self._loss_key_issues()
        needed = POLICY_LOSSES.entry(self.loss_type).aggregation
        if needed is not None and self.loss_agg_mode != needed:
            message = (
                f"loss_type={self.loss_type!r} is defined with loss_agg_mode={needed!r}, not {self.loss_agg_mode!r}: "
                "its ratio is per sequence, so another mode weights each sequence by its length"
            )
            issues.append(
                ConfigIssue("loss_agg_mode", message, f"set loss_agg_mode: {needed} (or remove it)")
            )
        if self.clip_cov_lb >= self.clip_cov_ub:
            message = f"clip_cov_lb = {self.clip_cov_lb} must be below clip_cov_ub = {self.clip_cov_ub}"
            issues.append(ConfigIssue("clip_cov_lb", message, "no token could be selected; defaults 1 and 5"))
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            message = f"dual_clip_c = {self.dual_clip_c} must be > 1: it bounds the ratio of negative-advantage tokens above 1 + clip"
            issues.append(ConfigIssue("dual_clip_c", message, "typical value 3.0; null disables dual-clip"))
        elif self.dual_clip_c is not None and self.loss_type != "ppo":
            message = f"dual_clip_c applies to loss_type='ppo' only, not {self.loss_type!r}"
            issues.append(ConfigIssue("dual_clip_c", message, "remove dual_clip_c or use loss_type=ppo"))
        if self.tis_cap is not None and self.mismatch_correction is not None:
            message = "tis_cap and mismatch_correction both pick a mismatch correction"
            hint = "keep one: tis_cap C is mismatch_correction {type: tis, high: C}"
            issues.append(ConfigIssue("tis_cap", message, hint))
        return issues

    def correction(self) -> MismatchCorrection | None:
        """The mismatch correction in use: ``mismatch_correction``, or TIS from ``tis_cap``, or None."""
        if self.tis_cap is not None:
            return MismatchCorrection(type="tis", level=self.tis_level, high=self.tis_cap)
        return self.mismatch_correction

    def _loss_key_issues(self) -> list[ConfigIssue]:
        """Keys of one loss set to a non-default value beside another ``loss_type``: they would be silently
        ignored. (By value, not by presence: a dumped and reloaded config carries every key at its default.)"""
        issues = []
        fields = type(self).model_fields
        for key, losses in _LOSS_KEYS.items():
            if getattr(self, key) != fields[key].default and self.loss_type not in losses:
                message = (
                    f"{key} applies to loss_type {' or '.join(map(repr, losses))}, not {self.loss_type!r}"
                )
                issues.append(ConfigIssue(key, message, f"remove {key} or change loss_type"))
        return issues

    def _kl_issues(self) -> list[ConfigIssue]:
        if self.kl_mode == "none" and self.kl_target is not None:
            message = "kl_target sets an adaptive KL controller, but kl_mode is 'none'"
            return [
                ConfigIssue("kl_target", message, "set kl_mode to 'reward' or 'loss', or remove kl_target")
            ]
        if self.kl_mode != "none" and self.kl_coef == 0 and self.kl_target is None:
            message = f"kl_mode={self.kl_mode!r} with kl_coef=0 computes the KL (and runs the reference model) for nothing"
            return [
                ConfigIssue(
                    "kl_coef", message, "set kl_coef > 0, or kl_mode='none' to drop the reference model"
                )
            ]
        return []

    def _sampling_issues(self) -> list[ConfigIssue]:
        high = self.dynamic_sampling_max_std
        if high is not None and self.dynamic_sampling_min_std > high:
            message = f"dynamic_sampling_min_std = {self.dynamic_sampling_min_std} exceeds dynamic_sampling_max_std = {high}"
            return [ConfigIssue("dynamic_sampling_min_std", message, "every group would be dropped")]
        return []

    def check(self, samples_per_prompt: int, *, where: str = "batch.samples_per_prompt") -> list[ConfigIssue]:
        """Issues with the group size (``G``), for the pipeline's own validator: group estimators and dynamic
        sampling compare samples of one prompt, so they need ``G >= 2``."""
        if samples_per_prompt >= 2:
            return []
        hint = f"set {where} >= 2 (4-16 is usual)"
        issues = []
        if "groups" in ESTIMATORS.entry(self.adv_estimator).needs:
            message = f"adv_estimator={self.adv_estimator!r} compares samples of a prompt, but {where} = {samples_per_prompt}"
            issues.append(ConfigIssue(where, message, hint))
        if self.dynamic_sampling:
            message = f"dynamic_sampling drops groups with equal rewards, but {where} = {samples_per_prompt}"
            issues.append(ConfigIssue(where, message, hint))
        return issues


def preset_config(name: PresetName, **overrides: Any) -> AlgorithmConfig:
    """The config of preset ``name`` with ``overrides`` on top (explicit keys win)."""
    return AlgorithmConfig.model_validate({"preset": name, **overrides})


__all__ = ["PRESETS", "PRESET_NAMES", "AlgorithmConfig", "GiGPOConfig", "MismatchCorrection", "preset_config"]
