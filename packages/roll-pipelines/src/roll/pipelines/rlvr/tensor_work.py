"""RLVR's tensor work, run in the train actor's process (``policy.actor.apply(fn, ...)``), not in the driver.

The driver of a run holds no model, and torch costs every process that imports it ~550 MB resident. So the few
tensor steps of an RLVR step (padding the ragged rollout, reward shaping, the advantage estimator, the step's
metrics, the warm-up's batches) go to rank 0 of ``actor_train``, which has torch loaded anyway, as one call each:
:meth:`~roll.core.cluster.Worker.apply` pickles these functions by reference, so this module imports nothing
heavy at the top; each function imports its torch-side helpers in its body. The arithmetic is the one the
driver did before, in the same torch ops on the same values, so a run's metrics are bit-identical.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from roll.core import columns as C
from roll.core.batch import Batch

if TYPE_CHECKING:
    from roll.pipelines.algorithms.presets import AlgorithmConfig
    from roll.pipelines.policy.objective import PolicyObjective


def score(batch: Batch, *, pad_id: int, algorithm: AlgorithmConfig, max_new_tokens: int) -> Batch:
    """Padded ``[B, T]`` sequences of the ragged rollout, plus ``rewards_B``: the scores after the overlong
    penalty and clipping."""
    from roll.data.sequences import to_sequences
    from roll.pipelines.algorithms.dapo import soft_overlong_penalty
    from roll.pipelines.algorithms.stats import clip_rewards

    batch = to_sequences(batch.to_torch(), pad_id)
    a = algorithm
    rewards_B = batch.tensors[C.SCORES].float()
    if a.overlong_penalty:
        cache = a.overlong_cache_len or max(1, max_new_tokens // 5)
        lengths_B = batch.tensors[C.RESPONSE_MASK].sum(-1)
        rewards_B = rewards_B + soft_overlong_penalty(
            lengths_B, max_len=max_new_tokens, cache_len=cache, penalty_factor=a.overlong_penalty_factor
        )
    if a.reward_clip is not None:
        rewards_B = clip_rewards(rewards_B, max_abs=a.reward_clip)
    batch[C.REWARDS] = rewards_B
    return batch


def filter_overlong(batch: Batch) -> Batch:
    """DAPO's overlong filter: truncated samples (``finish_reason == "length"``) leave the response mask."""
    import torch

    from roll.pipelines.algorithms.dapo import overlong_filter

    batch = batch.to_torch()
    truncated_B = torch.tensor([r == "length" for r in batch[C.FINISH_REASON]])
    batch[C.RESPONSE_MASK] = overlong_filter(batch.tensors[C.RESPONSE_MASK].float(), truncated_B).long()
    return batch


def advantages(batch: Batch, objective: PolicyObjective, *, group_size: int) -> tuple[Batch, PolicyObjective]:
    """The preset's estimator over the groups of ``group_size`` rows; the objective comes back too (its running
    reward statistics move)."""
    from roll.pipelines.algorithms.estimators import layout_group_ids

    batch = batch.to_torch()
    batch[C.GROUP_ID] = layout_group_ids(len(batch) // group_size, group_size)
    return objective.advantages(batch, batch.tensors[C.REWARDS]), objective


def step_metrics(
    batch: Batch, *, trainer_version: int, domain_of: Mapping[str, str], default: str | None, critic: bool
) -> tuple[dict[str, float], dict[str, float], float, float]:
    """The rollout's metrics (:func:`~roll.pipelines.rlvr.metrics.rollout_metrics`), the critic's (empty without
    one), and the generated and total token counts the throughputs divide."""
    from roll.pipelines.policy.critic import batch_metrics
    from roll.pipelines.rlvr import metrics as M

    batch = batch.to_torch()
    rollout = M.rollout_metrics(batch, trainer_version=trainer_version, domain_of=domain_of, default=default)
    values = batch_metrics(batch, batch.tensors[C.RESPONSE_MASK].float()) if critic else {}
    return rollout, values, M.generated_tokens(batch), M.total_tokens(batch)


def eval_metrics(scored: Batch, *, domain_of: Mapping[str, str], default: str | None) -> dict[str, float]:
    """Reward and accuracy of scored held-out answers, overall and per domain."""
    from roll.pipelines.rlvr import metrics as M

    scored = scored.to_torch()
    out = {"reward": float(scored[C.SCORES].mean()), "accuracy": float(scored[C.CORRECT].mean())}
    out.update(M.domain_metrics(scored, domain_of, prefix="domain", default=default))
    return out


def warmup_batches(
    rows: Sequence[Mapping[str, Any]], *, steps: int, batch_size: int, seed: int, pad_id: int
) -> list[Batch]:
    """The warm-up's ``steps`` batches of ``batch_size`` rows, in an order seeded by ``seed`` (cycling)."""
    import torch

    from roll.pipelines.rlvr.data import sft_batch

    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))
    return [
        sft_batch(
            [dict(rows[int(order[(i * batch_size + j) % len(rows)])]) for j in range(batch_size)],
            pad_id=pad_id,
        )
        for i in range(steps)
    ]
