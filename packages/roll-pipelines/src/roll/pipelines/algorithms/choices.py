"""The names of every algorithmic choice, as ``Literal`` types shared by the config and the tensor functions.

Torch-free, so :mod:`.presets` (a config module) can use them without importing torch.
"""

from __future__ import annotations

from typing import Literal, get_args

AdvEstimator = Literal["gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gigpo"]
PolicyLossType = Literal["ppo", "gspo", "cispo", "topr", "sapo", "gmpo", "clip_cov", "kl_cov"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLMode = Literal["none", "reward", "loss"]
KLEstimator = Literal["k1", "k2", "k3", "low_var_kl", "k1+", "k3+"]
RewardNorm = Literal["none", "batch", "group", "tag", "running"]
"""Reward normalization before the estimator: ``batch`` over all rows, ``group`` within groups (``group_id_B``),
``tag`` within the rows of each tag (domains or envs with different reward scales), ``running`` by a running mean
and std over the run (population std everywhere)."""
RatioLevel = Literal["token", "sequence"]
MismatchCorrectionType = Literal["tis", "mis", "icepop"]
"""Corrections of the train/infer mismatch (:data:`.registry.MISMATCH_CORRECTIONS`)."""
DivergenceName = Literal[
    "forward_kl", "reverse_kl", "skew_forward_kl", "skew_reverse_kl", "js", "adaptive_kl"
]
PresetName = Literal[
    "ppo", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gspo", "dapo", "topr", "cispo"
]

LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)
DIVERGENCES: tuple[str, ...] = get_args(DivergenceName)
PRESET_NAMES: tuple[str, ...] = get_args(PresetName)
