"""Registry names keep their promise (issue 30 item 4): every estimator, policy loss, KL estimator and aggregation
mode of roll against verl's own formula on identical batches.

verl is not installed here (it pins its own stack), so each ``_verl_*`` below is a transcription of the function of
the same purpose in ``verl/trainer/ppo/core_algos.py`` and ``verl/utils/torch_functional.py`` at verl commit
b178a3cd56f58b2d502255daba591e92833930a7 (2026-01-29), kept line for line where it matters (same clamps, same
epsilons, same order of the random draw), with verl's config plumbing removed. Where roll differs by a stated
convention (docs/algorithms.md, "Conventions against verl and TRL"), the test sets the batch or the option so that
the convention does not apply, and a second assertion pins the difference itself.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from torch.testing import assert_close

from roll.pipelines.algorithms.aggregate import Aggregation, aggregate_loss
from roll.pipelines.algorithms.covariance import clip_cov_policy_loss, kl_cov_policy_loss
from roll.pipelines.algorithms.estimators import AdvantageInputs, EstimatorParams, estimate_advantages
from roll.pipelines.algorithms.kl import kl_estimate
from roll.pipelines.algorithms.policy_loss import (
    cispo_policy_loss,
    gmpo_policy_loss,
    gspo_policy_loss,
    ppo_policy_loss,
    sapo_policy_loss,
)

# ----------------------------------------------------------------------------------- verl, transcribed


def _vmean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    s = (values * mask).sum() if axis is None else (values * mask).sum(axis)
    return s / ((mask.sum() if axis is None else mask.sum(axis)) + 1e-8)


def _vwhiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mean = _vmean(values, mask)
    var = _vmean((values - mean) ** 2, mask) * mask.sum() / (mask.sum() - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8)


def _verl_agg(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, scale: int | None = None
) -> torch.Tensor:
    if mode == "token-mean":
        return (loss_mat * mask).sum() / mask.sum()
    seq_tokens = mask.sum(-1)
    if mode == "seq-mean-token-sum":
        seq = (loss_mat * mask).sum(-1)
    elif mode == "seq-mean-token-mean":
        seq = (loss_mat * mask).sum(-1) / (seq_tokens + 1e-8)
    else:  # seq-mean-token-sum-norm
        return (loss_mat * mask).sum() / (scale if scale is not None else mask.shape[-1])
    seq_mask = (seq_tokens > 0).float()
    return (seq * seq_mask).sum() / seq_mask.sum()


def _verl_ppo(old, logp, adv, mask, lo=0.2, hi=0.2, c=3.0):  # type: ignore[no-untyped-def]
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - lo, 1 + hi)
    clip1 = torch.maximum(l1, l2)
    clip2 = torch.min(-adv * c, clip1)
    return _verl_agg(torch.where(adv < 0, clip2, clip1), mask, "token-mean")


def _verl_gspo(old, logp, adv, mask, lo, hi):  # type: ignore[no-untyped-def]
    seq = ((logp - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    ratio = torch.exp(torch.clamp(logp - logp.detach() + seq.detach().unsqueeze(-1), max=10.0))
    losses = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - lo, 1 + hi))
    return _verl_agg(losses, mask, "seq-mean-token-mean")


def _verl_sapo(old, logp, adv, mask, tau_pos=1.0, tau_neg=1.05):  # type: ignore[no-untyped-def]
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    taus = torch.where(adv > 0, torch.tensor(tau_pos), torch.tensor(tau_neg))
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    return _verl_agg(-gates * adv, mask, "seq-mean-token-mean")


def _verl_geo_mean(old, logp, adv, mask, lo=0.4, hi=0.4):  # type: ignore[no-untyped-def]
    nkl = logp - old
    sgn = torch.sign(adv)
    nkl_min = sgn * torch.min(sgn * nkl, sgn * torch.clamp(nkl, -lo, hi))
    n = mask.sum(-1)
    ratio = torch.exp((nkl_min * mask).sum(-1) / (n + 1e-8))
    advantage = (adv * mask).sum(-1) / (n + 1e-8)
    return torch.mean(-advantage * ratio)


def _verl_cispo(old, logp, adv, mask, lo, hi):  # type: ignore[no-untyped-def]
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    return _verl_agg(-torch.clamp(ratio, 1 - lo, 1 + hi).detach() * adv * logp, mask, "token-mean")


def _verl_clip_cov(old, logp, adv, mask, lo=0.2, hi=0.2, ratio_k=2e-4, lb=1.0, ub=5.0):  # type: ignore[no-untyped-def]
    ratio = torch.exp(logp - old)
    l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - lo, 1 + hi)
    corr = torch.ones_like(adv)
    clip_by_origin = (l2 > l1) & (mask > 0)
    cov_all = (adv - _vmean(adv, mask)) * (logp - _vmean(logp.detach(), mask))
    cov_all[mask == 0] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf
    clip_num = max(int(ratio_k * mask.sum().item()), 1)
    idx = torch.nonzero((cov_all < ub) & (cov_all > lb) & (mask > 0))
    if len(idx) > 0:
        idx = idx[torch.randperm(len(idx))[: min(clip_num, len(idx))]]
        corr[idx[:, 0], idx[:, 1]] = 0
    return _verl_agg(torch.maximum(l1, l2) * corr, mask, "token-mean")


def _verl_kl_cov(old, logp, adv, mask, ratio_k=2e-4, coef=0.1):  # type: ignore[no-untyped-def]
    nkl = logp - old
    ratio = torch.exp(nkl)
    losses = (-adv * ratio).clone()
    losses_kl = -adv * ratio + coef * nkl.abs()
    valid = torch.nonzero((mask > 0).reshape(-1), as_tuple=True)[0]
    a, lp = adv[mask > 0].detach().reshape(-1), logp[mask > 0].detach().reshape(-1)
    cov = (a - a.mean()) * (lp - lp.mean())
    top = valid[torch.topk(cov, max(1, int(len(cov) * ratio_k)), largest=True).indices]
    rows, cols = top // adv.shape[1], top % adv.shape[1]
    losses[rows, cols] = losses_kl[rows, cols]
    return _verl_agg(losses, mask, "token-mean")


def _verl_kl(logp: torch.Tensor, ref: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "k1":
        return logp - ref
    if kind == "k2":
        return 0.5 * (logp - ref).square()
    kl = torch.clamp(ref - logp, -20, 20)  # verl's "k3" and "low_var_kl" are the same clamped k3
    return torch.clamp(torch.exp(kl) - kl - 1, -10, 10)


def _verl_kl_straight_through(logp: torch.Tensor, ref: torch.Tensor, kind: str) -> torch.Tensor:
    """verl's ``kl_penalty`` for ``k1+`` / ``k3+``: the forward value of k1 / k3, the backward of k2."""
    forward = _verl_kl(logp, ref, kind.rstrip("+"))
    backward = 0.5 * (logp - ref).square()
    return backward - backward.detach() + forward.detach()


def _verl_group_outcome(scores: torch.Tensor, index: list[int], kind: str) -> torch.Tensor:
    groups: dict[int, list[torch.Tensor]] = defaultdict(list)
    for i, g in enumerate(index):
        groups[g].append(scores[i])
    out = scores.clone()
    for i, g in enumerate(index):
        s = torch.stack(groups[g])
        mean, n = s.mean(), len(s)
        if kind == "grpo":
            out[i] = (scores[i] - mean) / (torch.std(s) + 1e-6)
        elif kind == "dr_grpo":
            out[i] = scores[i] - mean
        elif kind == "rloo":
            out[i] = scores[i] * n / (n - 1) - mean * n / (n - 1)
        else:  # reinforce_pp_baseline, before whitening
            out[i] = scores[i] - mean
    return out


def _verl_gae(rewards, values, mask, gamma, lam):  # type: ignore[no-untyped-def]
    nextvalues, lastgaelam, rev = 0, 0, []
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * mask[:, t] + (1 - mask[:, t]) * lastgaelam
        rev.append(lastgaelam)
    adv = torch.stack(rev[::-1], dim=1)
    return _vwhiten(adv, mask), adv + values


def _verl_reinforce_pp(rewards, mask, gamma):  # type: ignore[no-untyped-def]
    returns, running = torch.zeros_like(rewards), 0
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return _vwhiten(returns, mask) * mask, returns


# ------------------------------------------------------------------------------------------ the batch

B, T = 8, 6


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tail-padded rows of lengths 1..6 (no empty row), log-ratios of scale 0.3, advantages of both signs,
    advantages constant per row (the sequence-level losses assume it, as verl's GMPO says)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 1, 3, 5, 2, 6, 4, 3])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    old = -torch.rand(B, T, generator=g) * 3
    logp = (old + 0.3 * torch.randn(B, T, generator=g)).requires_grad_(True)
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    return old, logp, adv, mask


def _grads(fn_a, fn_b, logp):  # type: ignore[no-untyped-def]
    a, b = fn_a(), fn_b()
    (ga,) = torch.autograd.grad(a, logp)
    (gb,) = torch.autograd.grad(b, logp)
    return a, b, ga, gb


SEQ_MEAN = Aggregation("seq-mean-token-mean")

LOSSES = {
    "ppo (verl vanilla: dual-clip c=3 always on)": (
        lambda o, lp, a, m: ppo_policy_loss(lp, o, a, m, dual_clip_c=3.0)[0],
        lambda o, lp, a, m: _verl_ppo(o, lp, a, m),
    ),
    "gspo": (
        lambda o, lp, a, m: gspo_policy_loss(lp, o, a, m, clip_low=0.05, clip_high=0.06, agg=SEQ_MEAN)[0],
        lambda o, lp, a, m: _verl_gspo(o, lp, a, m, 0.05, 0.06),
    ),
    "sapo": (
        lambda o, lp, a, m: sapo_policy_loss(lp, o, a, m, agg=SEQ_MEAN)[0],
        lambda o, lp, a, m: _verl_sapo(o, lp, a, m),
    ),
    "gmpo (verl geo_mean)": (
        lambda o, lp, a, m: gmpo_policy_loss(lp, o, a, m, clip_low=0.2, clip_high=0.3, agg=SEQ_MEAN)[0],
        lambda o, lp, a, m: _verl_geo_mean(o, lp, a, m, 0.2, 0.3),
    ),
    "cispo": (
        lambda o, lp, a, m: cispo_policy_loss(lp, o, a, m, clip_low=1.0, clip_high=0.1)[0],
        lambda o, lp, a, m: _verl_cispo(o, lp, a, m, 1.0, 0.1),
    ),
    "kl_cov": (
        lambda o, lp, a, m: kl_cov_policy_loss(lp, o, a, m, ratio=0.2, coef=0.5)[0],
        lambda o, lp, a, m: _verl_kl_cov(o, lp, a, m, ratio_k=0.2, coef=0.5),
    ),
}


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_policy_loss_matches_verl(name: str, seed: int) -> None:
    ours, theirs = LOSSES[name]
    old, logp, adv, mask = _batch(seed)
    a, b, ga, gb = _grads(lambda: ours(old, logp, adv, mask), lambda: theirs(old, logp, adv, mask), logp)
    assert_close(a, b)
    assert_close(ga * mask, gb * mask)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clip_cov_matches_verl_draw_for_draw(seed: int) -> None:
    """Same global RNG state before each side: the same tokens are drawn (a wide ratio and bounds so several are)."""
    old, logp, adv, mask = _batch(seed)
    logp_scaled = (logp * 3).detach().requires_grad_(True)  # wider log-probs: covariances beyond 1

    def ours() -> torch.Tensor:
        torch.manual_seed(seed)
        return clip_cov_policy_loss(logp_scaled, old * 3, adv, mask, ratio=0.2, cov_lb=0.05, cov_ub=5.0)[0]

    def theirs() -> torch.Tensor:
        torch.manual_seed(seed)
        return _verl_clip_cov(old * 3, logp_scaled, adv, mask, ratio_k=0.2, lb=0.05, ub=5.0)

    a, b, ga, gb = _grads(ours, theirs, logp_scaled)
    assert_close(a, b)
    assert_close(ga * mask, gb * mask)
    torch.manual_seed(seed)
    _, metrics = clip_cov_policy_loss(logp_scaled, old * 3, adv, mask, ratio=0.2, cov_lb=0.05, cov_ub=5.0)
    assert float(metrics["cov_frac"]) > 0.05  # at least 2 of the 30 tokens drawn: the draw is exercised


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_aggregation_matches_verl_without_empty_rows(mode: str) -> None:
    old, _, _, mask = _batch()
    assert_close(aggregate_loss(old, mask, mode=mode), _verl_agg(old, mask, mode))  # type: ignore[arg-type]


def test_aggregation_conventions_that_differ_from_verl() -> None:
    """Two stated conventions. (1) An empty row counts as a sequence in roll's seq-mean modes (it adds 0); verl now
    leaves it out of the count: 3 rows, one empty, give roll 2/3 of verl's value. (2) seq-mean-token-sum-norm: roll
    is ``mean_b sum_t l / L``, verl ``sum_b sum_t l / L`` (no mean over rows): roll's is verl's divided by B."""
    loss = torch.ones(3, 4)
    mask = torch.tensor([[1.0, 1, 0, 0], [1.0, 1, 1, 1], [0.0, 0, 0, 0]])
    for mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        assert_close(aggregate_loss(loss, mask, mode=mode) * 3 / 2, _verl_agg(loss, mask, mode))  # type: ignore[arg-type]
    ours = aggregate_loss(loss, mask, mode="seq-mean-token-sum-norm", norm_len=4)
    assert_close(ours * 3, _verl_agg(loss, mask, "seq-mean-token-sum-norm", scale=4))


@pytest.mark.parametrize("kind", ["k1", "k2", "low_var_kl"])
def test_kl_estimators_match_verl(kind: str) -> None:
    """roll's ``k1`` = verl's ``k1``/``kl`` (``logp - ref``), ``k2`` = ``k2``/``mse``, ``low_var_kl`` = verl's
    ``low_var_kl`` and verl's ``k3`` (verl clamps both); roll's ``k3`` is the unclamped formula, equal inside the
    clamps (checked below) and finite beyond them where verl's saturates at 10."""
    old, logp, _, _ = _batch()
    assert_close(kl_estimate(logp, old, estimator=kind), _verl_kl(logp, old, kind))  # type: ignore[arg-type]
    assert_close(kl_estimate(logp, old, estimator="k3"), _verl_kl(logp, old, "k3"))
    far = torch.tensor([[-30.0]])
    assert float(kl_estimate(far, torch.zeros(1, 1), estimator="k3")) > 10.0
    assert float(_verl_kl(far, torch.zeros(1, 1), "k3")) == 10.0


@pytest.mark.parametrize("kind", ["k1+", "k3+"])
def test_straight_through_kl_matches_verl_in_value_and_gradient(kind: str) -> None:
    old, logp, _, _ = _batch()
    ours = kl_estimate(logp, old, estimator=kind)  # type: ignore[arg-type]
    theirs = _verl_kl_straight_through(logp, old, kind)
    assert_close(ours, theirs)
    (g_ours,) = torch.autograd.grad(ours.sum(), logp)
    (g_theirs,) = torch.autograd.grad(theirs.sum(), logp)
    assert_close(g_ours, g_theirs)


@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators_match_verl(kind: str) -> None:
    """Groups of 3 and 5 (no group of one: there verl keeps the raw reward, roll gives 0; stated convention)."""
    g = torch.Generator().manual_seed(3)
    rewards = torch.randn(B, generator=g)
    index = [0, 0, 0, 1, 1, 1, 1, 1]
    _, _, _, mask = _batch()
    inputs = AdvantageInputs(rewards, mask, group_ids_B=torch.tensor(index))
    ours = estimate_advantages(kind, inputs, EstimatorParams()).advantages_BT
    theirs = _verl_group_outcome(rewards, index, kind).unsqueeze(-1) * mask
    assert_close(ours, theirs)


def test_reinforce_pp_baseline_matches_verl() -> None:
    g = torch.Generator().manual_seed(4)
    rewards, index = torch.randn(B, generator=g), [0, 0, 0, 1, 1, 1, 1, 1]
    _, _, _, mask = _batch()
    inputs = AdvantageInputs(rewards, mask, group_ids_B=torch.tensor(index))
    ours = estimate_advantages("reinforce_pp_baseline", inputs, EstimatorParams()).advantages_BT
    centered = _verl_group_outcome(rewards, index, "baseline").unsqueeze(-1).expand(B, T) * mask
    assert_close(ours, _vwhiten(centered, mask) * mask)


def test_gae_and_reinforce_pp_match_verl() -> None:
    """GAE with ``whiten_advantages`` (verl always whitens GAE advantages; roll when asked, as the ppo preset does)
    and REINFORCE++ on tail-padded rows (verl resets the return at masked positions, roll carries it through them;
    the two agree when masked positions are only padding after the response)."""
    g = torch.Generator().manual_seed(5)
    _, _, _, mask = _batch()
    rewards = torch.randn(B, generator=g)
    values = torch.randn(B, T, generator=g) * mask
    token_rewards = torch.zeros(B, T)
    token_rewards[torch.arange(B), mask.sum(-1).long() - 1] = rewards
    inputs = AdvantageInputs(rewards, mask, group_ids_B=torch.zeros(B), values_BT=values)
    ours = estimate_advantages("gae", inputs, EstimatorParams(gamma=0.9, lam=0.8, whiten=True))
    adv, ret = _verl_gae(token_rewards, values, mask, 0.9, 0.8)
    assert ours.returns_BT is not None
    assert_close(ours.advantages_BT, adv * mask)
    assert_close(ours.returns_BT, ret * mask)
    ours = estimate_advantages("reinforce_pp", inputs, EstimatorParams(gamma=0.9))
    adv, ret = _verl_reinforce_pp(token_rewards, mask, 0.9)
    assert ours.returns_BT is not None
    assert_close(ours.advantages_BT, adv)
    assert_close(ours.returns_BT, ret * mask)
