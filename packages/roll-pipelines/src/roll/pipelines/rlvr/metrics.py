"""Per-step RLVR metrics: rewards and accuracy per domain, lengths, truncation, policy-version lag, throughput.

They run where the batch is torch (the train actor, :mod:`.tensor_work`) and import torch on first call, so the
driver that imports this module for :func:`throughput` and :func:`row_domains` does not. Pure functions of a
rollout batch (after :func:`roll.data.sequences.to_sequences`) and timings; the
pipeline merges them with the trainer's metrics (loss, clip fraction, KL, entropy, grad norm) and the
scheduler's counts (dropped groups, stale groups, requests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from roll.core import columns as C
from roll.core.batch import Batch

if TYPE_CHECKING:
    import torch


def rollout_metrics(
    batch: Batch, *, trainer_version: int, domain_of: Mapping[str, str], default: str | None = None
) -> dict[str, float]:
    """Reward/accuracy (overall and ``reward/<domain>/...``), response length, truncation, version lag (the
    trainer's version minus the version that generated each sample), the trained sample count, and the shares of
    rows the reward could not score (``reward/errors``) and whose prompt was cut (``data/prompt_truncated``)."""
    import torch

    scores_B = _t(batch, C.SCORES).float()
    lengths_B = _t(batch, C.RESPONSE_MASK).sum(-1).float()
    truncated_B = torch.tensor([r == "length" for r in batch[C.FINISH_REASON]], dtype=torch.float32)
    lag_B = (trainer_version - _t(batch, C.POLICY_VERSION)).float()
    out = {
        "reward/mean": float(scores_B.mean()),
        "reward/std": float(scores_B.std(correction=0)),
        "reward/accuracy": float(batch[C.CORRECT].mean()),
        "response/length_mean": float(lengths_B.mean()),
        "response/length_max": float(lengths_B.max()),
        "response/truncation_rate": float(truncated_B.mean()),
        "rollout/version_lag_mean": float(lag_B.mean()),
        "rollout/version_lag_max": float(lag_B.max()),
        "rollout/samples": float(len(batch)),
        "reward/errors": _share(batch, C.REWARD_ERROR),
        "data/prompt_truncated": _share(batch, C.PROMPT_TRUNCATED),
    }
    if C.RESPONSE_POLICY_VERSION in batch.non_tensors:  # partial rollout: per-token versions
        out.update(token_version_metrics(list(batch.non_tensors[C.RESPONSE_POLICY_VERSION]), trainer_version))
    out.update(domain_metrics(batch, domain_of, default=default))
    return out


def token_version_metrics(versions: Sequence[Sequence[int]], trainer_version: int) -> dict[str, float]:
    """Partial rollout: the share of samples whose tokens come from more than one policy version, the widest such
    span, and the lag (trainer version minus sampling version) of every token, mean and max."""
    spans = [max(v) - min(v) for v in versions if len(v)]
    lags = [trainer_version - int(t) for v in versions for t in v]
    if not spans:
        return {}
    return {
        "rollout/multi_version_share": sum(s > 0 for s in spans) / len(spans),
        "rollout/version_span_max": float(max(spans)),
        "rollout/token_version_lag_mean": sum(lags) / len(lags),
        "rollout/token_version_lag_max": float(max(lags)),
    }


def domain_metrics(
    batch: Batch, domain_of: Mapping[str, str], prefix: str = "reward", default: str | None = None
) -> dict[str, float]:
    """``<prefix>/<domain>/mean``, ``/std``, ``/accuracy``, ``/count`` for every domain present. A row no tag
    routes belongs to ``default`` (the domain that scored it), else to its own tag, else to ``untagged``: a
    metric name never holds an empty part (``reward//mean``)."""
    import torch

    domains = np.array(row_domains(batch, domain_of, default=default), dtype=object)
    out: dict[str, float] = {}
    for domain in sorted(set(domains.tolist())):
        rows = torch.from_numpy(np.flatnonzero(domains == domain))
        scores = _t(batch, C.SCORES)[rows].float()
        out[f"{prefix}/{domain}/mean"] = float(scores.mean())
        out[f"{prefix}/{domain}/std"] = float(scores.std(correction=0))
        out[f"{prefix}/{domain}/accuracy"] = float(_t(batch, C.CORRECT)[rows].float().mean())
        out[f"{prefix}/{domain}/count"] = float(len(rows))
    return out


def row_domains(batch: Batch, domain_of: Mapping[str, str], default: str | None = None) -> list[str]:
    """Each row's domain, named as :func:`domain_metrics` names it."""
    return [domain_of.get(str(t)) or default or str(t) or "untagged" for t in batch[C.TAG]]


def throughput(tokens: float, seconds: float, phase: str) -> dict[str, float]:
    """``time/<phase>_s`` and ``throughput/<phase>_tokens_per_s``."""
    return {f"time/{phase}_s": seconds, f"throughput/{phase}_tokens_per_s": tokens / max(seconds, 1e-9)}


def generated_tokens(batch: Batch) -> float:
    return float(batch[C.RESPONSE_MASK].sum())


def total_tokens(batch: Batch) -> float:
    return float(batch[C.ATTENTION_MASK].sum())


def _share(batch: Batch, name: str) -> float:
    """The mean of a per-row flag column (0 when the batch does not carry it)."""
    if name in batch.tensors:
        return float(batch.tensors[name].float().mean()) if len(batch) else 0.0
    if name in batch.non_tensors:
        return float(np.mean([bool(v) for v in batch.non_tensors[name]])) if len(batch) else 0.0
    return 0.0


def _t(batch: Batch, name: str) -> torch.Tensor:
    return batch.tensors[name]
