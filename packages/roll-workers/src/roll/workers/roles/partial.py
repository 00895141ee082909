"""Partial rollout on an inference worker: generate a segment of each sample, or continue one from its prefix.

A generation request that carries :data:`~roll.core.columns.SEGMENT_TOKENS` is a partial-rollout request (see
:mod:`roll.core.scheduler.partial` for the scheduler's side). Its rows are either fresh prompts (each becomes
``params.n`` sample rows) or, when :data:`~roll.core.columns.RESPONSE_PREFIX_IDS` is present, samples to
continue (one row each, with their ``sample_index_B``, log-probs and per-token versions so far). Each row gets at
most ``segment_tokens_B`` new tokens under the weights served now; a row that reaches that budget before its
``params.max_new_tokens`` comes back with ``finish_reason`` ``"abort"``, and the scheduler sends it again after
any weight update that queued behind this request (Ray runs an actor's calls in order). That is how a weight
update interrupts a long sample: at a segment boundary, the sample continuing from its prefix under the new
weights.

Every returned row carries the whole response so far (prefix + new tokens), its per-token log-probs (those of
the sampler, which the trainer's importance weights and the mismatch toolkit read) and per-token policy versions
(:data:`~roll.core.columns.RESPONSE_POLICY_VERSION`); ``policy_version_B`` is that of its oldest token.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from roll.core import columns as C
from roll.core.batch import PAD_COLUMN, Batch
from roll.core.errors import DataError, WorkerError
from roll.workers.config import SamplingParams
from roll.workers.types import ContinuesSamples, FinishReason, GeneratedSample

__all__ = ["generate_segment", "is_segment_request"]


def is_segment_request(prompts: Batch) -> bool:
    return C.SEGMENT_TOKENS in prompts.tensors


def generate_segment(
    strategy: Any, prompts: Batch, params: SamplingParams, seeds: list[int] | None, role: str
) -> Batch:
    """One segment of every sample of ``prompts`` (see the module docstring); rows in sample order.

    ``seeds``: each prompt row's seed (``prompt_seed_B``, or derived by the worker); required, since a continued
    sample must draw from the same stream in every segment."""
    if not isinstance(strategy, ContinuesSamples):
        raise WorkerError(
            f"{role}: strategy {type(strategy).__name__} cannot continue samples (partial rollout)"
        )
    if seeds is None:
        raise DataError("partial rollout needs seeded samples: give prompt_seed_B or SamplingParams.seed")
    prompts = Batch(dict(prompts.tensors), dict(prompts.non_tensors), prompts.meta)
    prompts[C.PROMPT_SEED] = torch.tensor(seeds, dtype=torch.long)
    rows = _sample_rows(prompts, params.n)
    prefixes = [list(map(int, p)) for p in rows.non_tensors[C.RESPONSE_PREFIX_IDS]]
    budgets = [
        min(int(seg), params.max_new_tokens - len(prefix))
        for seg, prefix in zip(rows.tensors[C.SEGMENT_TOKENS].tolist(), prefixes)
    ]
    if min(budgets, default=1) < 1:
        raise DataError(f"a row to continue already has {params.max_new_tokens} tokens (max_new_tokens)")
    by_budget: dict[int, list[int]] = defaultdict(list)
    for i, budget in enumerate(budgets):
        by_budget[budget].append(i)
    new: dict[int, GeneratedSample] = {}
    prompt_ids = [list(map(int, p)) for p in rows.non_tensors[C.PROMPT_IDS]]
    seed_B, sample_B = rows.tensors[C.PROMPT_SEED].tolist(), rows.tensors[C.SAMPLE_INDEX].tolist()
    for budget, index in by_budget.items():
        out = strategy.continue_samples(
            [prompt_ids[i] for i in index],
            [prefixes[i] for i in index],
            params,
            sample_indices=[sample_B[i] for i in index],
            seeds=[seed_B[i] for i in index],
            budget=budget,
        )
        new.update({index[s.prompt_index]: s for s in out})
    if len(new) != len(rows):
        raise WorkerError(f"{role}: {len(rows) - len(new)} of {len(rows)} samples came back without output")
    return _joined(rows, [new[i] for i in range(len(rows))], params.max_new_tokens)


def _sample_rows(prompts: Batch, n: int) -> Batch:
    """One row per sample: rows to continue as given; a fresh prompt row ``n`` times with an empty prefix."""
    if C.RESPONSE_PREFIX_IDS in prompts.non_tensors:
        for name in (C.SAMPLE_INDEX, C.PROMPT_IDS):
            if name not in prompts:
                raise DataError(f"rows to continue need {name}")
        return prompts
    if C.PROMPT_IDS not in prompts.non_tensors:
        raise DataError("partial rollout reads prompt_ids (token lists)")
    if C.PROMPT_INDEX not in prompts.tensors:
        prompts = prompts.union(Batch({C.PROMPT_INDEX: torch.arange(len(prompts))}))
    rows = prompts.select(torch.arange(len(prompts)).repeat_interleave(n))
    rows[C.SAMPLE_INDEX] = torch.arange(n).repeat(len(prompts))
    for name in (C.RESPONSE_PREFIX_IDS, C.RESPONSE_LOGP, C.RESPONSE_POLICY_VERSION):
        rows[name] = [[] for _ in range(len(rows))]
    return rows


def _joined(rows: Batch, new: list[GeneratedSample], max_new_tokens: int) -> Batch:
    """The rows with prefix + new tokens, log-probs and versions, the finish reason and the oldest version."""
    response, logp, versions, reasons = [], [], [], []
    for prefix, prefix_logp, prefix_v, sample in zip(
        rows.non_tensors[C.RESPONSE_PREFIX_IDS],
        rows.non_tensors[C.RESPONSE_LOGP],
        rows.non_tensors[C.RESPONSE_POLICY_VERSION],
        new,
    ):
        ids = [*map(int, prefix), *sample.token_ids]
        response.append(ids)
        logp.append([*map(float, prefix_logp), *sample.logprobs])
        versions.append([*map(int, prefix_v), *[sample.policy_version] * len(sample.token_ids)])
        cut = sample.finish_reason == "length" and len(ids) < max_new_tokens
        reason: FinishReason = "abort" if cut else sample.finish_reason
        reasons.append(reason)
    keep = [C.PROMPT_INDEX, C.SAMPLE_INDEX, C.PROMPT_SEED, PAD_COLUMN]
    tensors = {k: rows.tensors[k] for k in keep if k in rows.tensors}
    tensors[C.POLICY_VERSION] = torch.tensor([min(v) if v else 0 for v in versions], dtype=torch.long)
    non_tensors: dict[str, Any] = {
        C.PROMPT_IDS: list(rows.non_tensors[C.PROMPT_IDS]),
        C.RESPONSE_IDS: response,
        C.RESPONSE_LOGP: logp,
        C.RESPONSE_POLICY_VERSION: versions,
        C.FINISH_REASON: reasons,
        C.TEXT: [s.text for s in new],
    }
    return Batch(tensors, non_tensors, rows.meta)
