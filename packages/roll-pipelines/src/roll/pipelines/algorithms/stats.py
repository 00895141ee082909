"""The tensor helpers the advantage estimators share: whitening, group statistics, discounted returns, reward
normalization and clipping, as pure functions of tensors. The estimators themselves are in :mod:`.estimators`.

Shapes: ``B`` rows (sequences), ``T`` tokens. ``mask_BT`` is 1 on the tokens being trained (the response). A
group is the rows that share an id (``group_ids_B``: the samples of one prompt, the envs of one seed, GiGPO's
steps from one anchor state), of any size and in any row order.

Standard deviations of groups and of whitened tokens are Bessel-corrected (divide by ``n - 1``) by default, as
``torch.std`` in DeepSeekMath-style GRPO implementations (TRL, verl) does; reward normalization uses the
population std. A group of one has std 0 (not NaN). A group whose values are all equal has mean exactly that
value and std 0, so its centered values are exactly 0: ``mean`` rounds (eight rewards of 0.3 have a float32 mean
3e-8 off 0.3), and GRPO's ``/ (std + 1e-6)`` would turn that into advantages of +-0.03 for a group that carries
no signal (a gradient from rounding, which would also keep such rows from being left out of the training forward
as inert).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from roll.core.errors import ConfigError, DataError
from roll.pipelines.algorithms.aggregate import masked_mean, masked_var
from roll.pipelines.algorithms.choices import RewardNorm

# ----------------------------------------------------------------------------------------------------------
# Masked whitening and shape helpers


def masked_whiten(
    x_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    shift_mean: bool = True,
    eps: float = 1e-8,
    unbiased: bool = True,
) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` with statistics over masked entries only; padding comes back as 0.

    ``shift_mean=False`` rescales without centering (adds the mean back), as PPO implementations do for
    returns-like quantities.
    """
    mean = masked_mean(x_BT, mask_BT)
    var = masked_var(x_BT, mask_BT, unbiased=unbiased)
    whitened = (x_BT - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask_BT.to(x_BT.dtype)


def expand_to_tokens(scores_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Broadcast one value per sequence over its trained tokens: ``scores_B[:, None] * mask_BT``."""
    return scores_B.reshape(-1, 1) * mask_BT.to(scores_B.dtype)


def _last_token_index(mask_BT: torch.Tensor) -> torch.Tensor:
    """Index of each row's last trained token (0 for an empty row), shape ``[B]``."""
    positions_T = torch.arange(mask_BT.shape[-1], device=mask_BT.device)
    return (positions_T * mask_BT.long()).argmax(dim=-1)


def outcome_to_token_rewards(scores_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Token rewards with the outcome score on each sequence's last trained token and 0 elsewhere."""
    rewards_BT = torch.zeros(mask_BT.shape, dtype=scores_B.dtype, device=scores_B.device)
    nonempty_B = mask_BT.bool().any(dim=-1).to(scores_B.dtype)
    rewards_BT.scatter_(1, _last_token_index(mask_BT).unsqueeze(1), (scores_B * nonempty_B).unsqueeze(1))
    return rewards_BT


# ----------------------------------------------------------------------------------------------------------
# Discounted returns


def discounted_returns(rewards_BT: torch.Tensor, mask_BT: torch.Tensor, *, gamma: float) -> torch.Tensor:
    """``R_t = r_t + gamma * R_{t+1}`` over trained tokens; masked positions are skipped (the return flows
    through them unchanged, as across environment tokens in multi-turn rollouts) and come back as 0."""
    mask = mask_BT.to(rewards_BT.dtype)
    returns_BT = torch.zeros_like(rewards_BT)
    running_B = rewards_BT.new_zeros(rewards_BT.shape[0])
    for t in reversed(range(rewards_BT.shape[-1])):
        updated_B = rewards_BT[:, t] + gamma * running_B
        running_B = mask[:, t] * updated_B + (1 - mask[:, t]) * running_B
        returns_BT[:, t] = running_B
    return returns_BT * mask


# ----------------------------------------------------------------------------------------------------------
# Groups given by ids (variable-size groups; GiGPO's anchor-state groups)


def _safe_denominator(std: torch.Tensor, eps: float) -> torch.Tensor:
    # A zero std means every centered value is 0 too; the floor keeps eps=0 from producing 0/0 = NaN.
    return (std + eps).clamp(min=torch.finfo(std.dtype).tiny)


def group_index(group_ids_B: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids (ints, e.g. hashes of anchor states) to ``0..n_groups-1``."""
    unique, index_B = torch.unique(group_ids_B, return_inverse=True)
    return index_B, int(unique.numel())


def group_mean_std(
    scores_B: torch.Tensor, group_ids_B: torch.Tensor, *, unbiased: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each element's group mean and group std, shape ``[B]`` each (a group of one has std 0).

    In a group whose scores are all equal the mean is that score exactly and the std 0 (module docstring).
    """
    index_B, n = group_index(group_ids_B)
    count_N = torch.zeros(n, dtype=scores_B.dtype, device=scores_B.device).index_add_(
        0, index_B, torch.ones_like(scores_B)
    )
    sum_N = torch.zeros_like(count_N).index_add_(0, index_B, scores_B)
    low_N = torch.zeros_like(count_N).scatter_reduce(0, index_B, scores_B, "amin", include_self=False)
    high_N = torch.zeros_like(count_N).scatter_reduce(0, index_B, scores_B, "amax", include_self=False)
    mean_B = torch.where((low_N == high_N)[index_B], scores_B, (sum_N / count_N)[index_B])
    sq_N = torch.zeros_like(count_N).index_add_(0, index_B, (scores_B - mean_B) ** 2)
    denom_N = (count_N - 1).clamp(min=1) if unbiased else count_N
    return mean_B, (sq_N / denom_N).sqrt()[index_B]


def group_normalize(
    scores_B: torch.Tensor,
    group_ids_B: torch.Tensor,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> torch.Tensor:
    """GRPO's normalization over groups given by ids: ``(s - mean_g) / (std_g + eps)`` (or ``s - mean_g``)."""
    mean_B, std_B = group_mean_std(scores_B, group_ids_B, unbiased=unbiased)
    centered_B = scores_B - mean_B
    return centered_B / _safe_denominator(std_B, eps) if norm_by_std else centered_B


# ----------------------------------------------------------------------------------------------------------
# Reward normalization and clipping


class RunningMeanStd:
    """Running mean and variance of a scalar stream (Chan et al. parallel update), in float64 on the host.

    ``update`` folds in a batch; ``normalize`` maps ``x`` to ``(x - mean) / sqrt(var + eps)``. The state is
    three numbers, saved by ``state_dict`` and restored by ``load_state_dict`` for checkpoints.
    """

    def __init__(self, eps: float = 1e-8) -> None:
        self.mean = 0.0
        self.var = 1.0
        self.count = 0.0
        self.eps = eps

    def update(self, x: torch.Tensor) -> None:
        values = x.detach().double().flatten()
        n = float(values.numel())
        if n == 0:
            return
        batch_mean = float(values.mean())
        batch_var = float(values.var(correction=0))
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.mean += delta * n / total
        self.var = m2 / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.var + self.eps)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def state_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), float(state["count"])


def _tag_ids(tags: Sequence[object]) -> torch.Tensor:
    """One id per distinct tag (sorted by name), as group ids for ``tag`` normalization."""
    names = sorted({str(t) for t in tags})
    return torch.tensor([names.index(str(t)) for t in tags], dtype=torch.long)


def normalize_rewards(
    rewards_B: torch.Tensor,
    *,
    mode: RewardNorm,
    group_ids_B: torch.Tensor | None = None,
    tags: Sequence[object] | None = None,
    running: RunningMeanStd | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Normalize outcome rewards before the advantage estimator (population std everywhere).

    - ``none``: unchanged;
    - ``batch``: ``(r - mean) / (std + eps)`` over the whole batch;
    - ``group``: the same within each group of ``group_ids_B``;
    - ``tag``: the same within the rows of each tag (``tags``: domains or envs with different reward scales);
    - ``running``: update ``running`` with this batch, then ``(r - mean) / sqrt(var + eps)`` with its statistics.
    """
    if mode == "none":
        return rewards_B
    if mode == "batch":
        return (rewards_B - rewards_B.mean()) / (rewards_B.std(correction=0) + eps)
    if mode in ("group", "tag"):
        ids_B = group_ids_B if mode == "group" else (_tag_ids(tags) if tags is not None else None)
        if ids_B is None:
            raise DataError(f"reward normalization {mode!r} needs the rows' {mode} ids")
        return group_normalize(rewards_B, ids_B, unbiased=False, eps=eps)
    if mode == "running":
        if running is None:
            raise ConfigError("reward normalization 'running' needs a RunningMeanStd passed as running=")
        running.update(rewards_B)
        return running.normalize(rewards_B)
    raise ConfigError(f"unknown reward normalization {mode!r}; known: none, batch, group, tag, running")


def _clip_symmetric(x: torch.Tensor, max_abs: float, what: str) -> torch.Tensor:
    if max_abs <= 0:
        raise ConfigError(f"{what} clip must be positive, got {max_abs}")
    return x.clamp(-max_abs, max_abs)


def clip_rewards(rewards: torch.Tensor, *, max_abs: float) -> torch.Tensor:
    """Clamp rewards into ``[-max_abs, max_abs]``."""
    return _clip_symmetric(rewards, max_abs, "reward")


def clip_advantages(advantages: torch.Tensor, *, max_abs: float) -> torch.Tensor:
    """Clamp advantages into ``[-max_abs, max_abs]``."""
    return _clip_symmetric(advantages, max_abs, "advantage")
