"""Metrics of ``k`` sampled answers per prompt, shared by ``roll eval`` (``rlvr_rollout``) and the RL modes'
validation: the unbiased pass@k estimator, mean@k and maj@k. Pure Python.

For one prompt with ``n`` answers of which ``c`` are correct:

- ``mean@k``: ``c / n``, the expected accuracy of one sampled answer (``n = k``);
- ``pass@k``: the chance that at least one of ``k`` answers drawn without replacement from the ``n`` is correct,
  ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): unbiased
  for the pass@k of the sampling policy, and with ``n = k`` simply whether any answer is correct;
- ``maj@k``: whether the answer most of the ``k`` give is correct (self-consistency, Wang et al. 2023). Answers
  vote by the final answer the reward extracted (``reward_answer``), else by their whitespace-normalized text;
  a tie goes to the answer given first (deterministic); answers with the same vote key count as one.

Each is averaged over prompts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that at least one of ``k`` answers drawn without replacement from ``n`` (``c`` correct) is correct:
    ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021). ``n = 4, c = 1, k = 2``: ``1 - 3/6 = 0.5``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def vote_key(answer: str | None, text: str | None) -> str:
    """What an answer votes with: the reward's extracted answer, else the response text, whitespace-normalized."""
    return " ".join((answer if answer is not None else text or "").split())


def majority_correct(keys_G: Sequence[str], correct_G: Sequence[bool]) -> bool:
    """Whether the most frequent key's answer is correct (the first answer giving that key; ties: the key given
    first)."""
    counts = Counter(keys_G)
    top = max(counts.values())
    winner = next(key for key in keys_G if counts[key] == top)
    return bool(correct_G[list(keys_G).index(winner)])


def sampled_metrics(
    correct_PG: Sequence[Sequence[bool]], keys_PG: Sequence[Sequence[str]], *, prefix: str = ""
) -> dict[str, float]:
    """``<prefix>mean@k``, ``<prefix>pass@k`` and ``<prefix>maj@k`` over ``P`` prompts of ``k`` answers each (``k``
    from the rows; every row must have the same), plus ``pass@j`` for the powers of two ``j < k``."""
    ks = {len(row) for row in correct_PG}
    if len(ks) != 1:
        raise ValueError(f"every prompt needs the same number of answers, got {sorted(ks)}")
    (k,) = ks
    P = len(correct_PG)
    counts = [sum(map(bool, row)) for row in correct_PG]
    out = {
        f"{prefix}mean@{k}": sum(c / k for c in counts) / P,
        f"{prefix}maj@{k}": sum(majority_correct(keys, row) for keys, row in zip(keys_PG, correct_PG)) / P,
    }
    for j in [*(2**i for i in range(k.bit_length()) if 2**i < k), k]:
        out[f"{prefix}pass@{j}"] = sum(pass_at_k(k, c, j) for c in counts) / P
    return out
