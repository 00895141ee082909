"""On-policy distillation's pure pieces: the log-ratio advantage, tag routing, and the config's routing checks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from roll.core.errors import DataError
from roll.pipelines.distill.onpolicy import distill_advantages, route_by_tag
from roll.pipelines.distill.onpolicy_config import OnPolicyDistillConfig


def test_advantage_is_negative_log_ratio_masked() -> None:
    """Golden: logp_s = [-1, -2, -3], logp_t = [-1.5, -1, -3], mask [1, 1, 0] -> -(s - t) = [-0.5, 1, 0]."""
    s = torch.tensor([[-1.0, -2.0, -3.0]])
    t = torch.tensor([[-1.5, -1.0, -3.0]])
    mask = torch.tensor([[1, 1, 0]])
    torch.testing.assert_close(distill_advantages(s, t, mask), torch.tensor([[-0.5, 1.0, 0.0]]))
    torch.testing.assert_close(
        distill_advantages(s, t, mask, distill_coef=2.0, clip=0.8), torch.tensor([[-1.0, 1.6, 0.0]])
    )


def test_advantage_adds_rl_advantage_with_coefficient() -> None:
    s, t = torch.zeros(2, 2), torch.full((2, 2), -1.0)  # log-ratio term = -1
    rl = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.ones(2, 2)
    got = distill_advantages(s, t, mask, rl_advantages_BT=rl, rl_coef=0.5)
    torch.testing.assert_close(got, torch.tensor([[-0.5, -0.5], [-1.5, -1.5]]))
    with pytest.raises(ValueError, match="rl_advantages_BT"):
        distill_advantages(s, t, mask, rl_coef=1.0)


def test_reinforce_gradient_of_the_advantage_is_reverse_kl_gradient() -> None:
    """Sampling y ~ q, E[-(log q - log p)(y) * grad log q(y)] = -grad KL(q || p): checked exactly by enumeration."""
    logits = torch.tensor([0.3, -0.2, 1.0], requires_grad=True)
    log_p = torch.log_softmax(torch.tensor([1.0, 0.0, -1.0]), -1)
    log_q = torch.log_softmax(logits, -1)
    adv = distill_advantages(log_q.detach()[None], log_p[None], torch.ones(1, 3))[0]
    surrogate = -(log_q.exp().detach() * adv * log_q).sum()  # policy-gradient loss, expectation over y
    (g_pg,) = torch.autograd.grad(surrogate, logits, retain_graph=True)
    kl = (log_q.exp() * (log_q - log_p)).sum()
    (g_kl,) = torch.autograd.grad(kl, logits)
    torch.testing.assert_close(g_pg, g_kl)


def test_route_by_tag_with_default_teacher_and_unknown_tag() -> None:
    routes = {"math": ["math", "gsm"], "code": ["code"], "general": None}
    rows = route_by_tag(["code", "math", "chat", "gsm", "code"], routes)
    assert rows == {"math": [1, 3], "code": [0, 4], "general": [2]}
    with pytest.raises(DataError, match="'chat' has no teacher"):
        route_by_tag(["math", "chat"], {"math": ["math"]})


def _cfg(teachers: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": {"path": "tiny-1m"},
        "batch": {"prompts_per_step": 4, "samples_per_prompt": 2, "micro_batch_samples": 8},
        "data": {"sources": [{"path": "builtin:arithmetic", "builtin_kind": "rl", "max_samples": 8}]},
        "rewards": {"arithmetic": {"type": "arithmetic", "tags": ["arithmetic"]}},
        "teachers": teachers,
    }


def test_config_rejects_ambiguous_routes() -> None:
    ok = OnPolicyDistillConfig.model_validate(_cfg({"a": {"tags": ["arithmetic"]}, "b": {}}))
    assert ok.teachers["b"].tags is None
    with pytest.raises(ValueError, match="routed to both teachers"):
        OnPolicyDistillConfig.model_validate(_cfg({"a": {"tags": ["x"]}, "b": {"tags": ["x"]}}))
    with pytest.raises(ValueError, match="at most one may"):
        OnPolicyDistillConfig.model_validate(_cfg({"a": {}, "b": {}}))
