"""Pure metrics of an evaluation: pass@k (the unbiased estimator of :mod:`roll.pipelines.common.sampled_eval`,
shared with the RL modes' validation), accuracy per domain, lengths."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from roll.pipelines.common.sampled_eval import pass_at_k

__all__ = ["domain_table", "pass_at_k", "summarize"]


def summarize(
    correct_PG: Sequence[Sequence[bool]],
    scores_PG: Sequence[Sequence[float]],
    lengths_PG: Sequence[Sequence[int]],
    domains_P: Sequence[str],
    ks: Sequence[int],
) -> dict[str, float]:
    """``accuracy``, ``score``, ``length_mean``, ``pass@k`` overall and ``<domain>/...`` per domain (P prompts,
    G answers each)."""
    out = _block(correct_PG, scores_PG, lengths_PG, ks, prefix="")
    for domain in sorted(set(domains_P)):
        rows = [p for p, d in enumerate(domains_P) if d == domain]
        c, s, n = ([table[p] for p in rows] for table in (correct_PG, scores_PG, lengths_PG))
        out |= _block(c, s, n, ks, prefix=f"{domain}/")  # type: ignore[arg-type]
        out[f"{domain}/prompts"] = float(len(rows))
    return out


def _block(
    correct_PG: Sequence[Sequence[bool]],
    scores_PG: Sequence[Sequence[float]],
    lengths_PG: Sequence[Sequence[int]],
    ks: Sequence[int],
    *,
    prefix: str,
) -> dict[str, float]:
    flat_correct = [float(c) for row in correct_PG for c in row]
    flat_scores = [s for row in scores_PG for s in row]
    flat_lengths = [n for row in lengths_PG for n in row]
    out = {
        f"{prefix}accuracy": sum(flat_correct) / len(flat_correct),
        f"{prefix}score": sum(flat_scores) / len(flat_scores),
        f"{prefix}length_mean": sum(flat_lengths) / len(flat_lengths),
    }
    for k in ks:
        values = [pass_at_k(len(row), sum(map(bool, row)), k) for row in correct_PG]
        out[f"{prefix}pass@{k}"] = sum(values) / len(values)
    return out


def domain_table(tags: Sequence[str], domain_of: Mapping[str, str], default: str | None) -> list[str]:
    """The reward domain of each tag (``default`` for untagged rows, as the reward scheduler routes them)."""
    return [domain_of.get(t) or default or t or "untagged" for t in tags]
