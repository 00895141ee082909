"""One advantage per trajectory, however many segments a chat template split it into.

A template that rewrites history (Qwen3 drops earlier turns' reasoning) splits a trajectory into segments, one
row each (:mod:`roll.agentic.env_manager.episode`). Estimating advantages row by row would count a split
trajectory's return once per segment: in GRPO's group mean and std, in RLOO's baseline, in a running reward
statistic, in REINFORCE++'s whitening. So the estimator runs on *trajectory rows* instead: :func:`pack` lays
each trajectory's trained tokens, segment after segment, into one row (its return, group, tag, and the per-token
columns the estimators read: old values, reference and sampling log-probs), and :func:`unpack` scatters the
advantages (and returns) back to the segments' positions.

The estimators read per-token tensors only at trained positions (masked positions carry values and returns
through unchanged), so a packed row gives exactly what the unsplit trajectory row would, given the same
per-token inputs: every trained token of trajectory ``i`` gets GRPO's ``(R_i - mean_g R) / (std_g R + eps)``
over the ``G`` *trajectories* of its group, REINFORCE++ its return-to-go across segment boundaries, GAE its
``delta`` chain across them. (The per-token inputs themselves are those of each segment's own context: the
policy saw the rewritten history, and that is what it is trained on.) So a segment's advantage is its trajectory's: what
trajectory-wise GRPO in ROLL and verl broadcasts over the one row of an unsplit multi-turn trajectory.

The loss, too, counts a split trajectory once: :func:`sequence_shares` gives each of its ``k`` rows
``seq_units_B = 1/k`` and ``seq_tokens_B`` = the trajectory's trained tokens, so the ``seq-mean-*`` aggregation
modes (:mod:`roll.pipelines.algorithms.aggregate`) weigh it as the one sequence it would be unsplit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.pipelines.policy.objective import PolicyObjective

__all__ = ["TrajectoryIndex", "is_split", "pack", "sequence_shares", "trajectory_advantages", "unpack"]

PER_TOKEN = (C.OLD_VALUES, C.REF_LOGP, C.OLD_LOGP, C.INFER_LOGP)
"""The ``[B, T]`` columns an estimator reads (GAE's values; KL in the reward's log-probs), gathered when present."""
PER_ROW = (C.SCORES, C.GROUP_ID, C.EPISODE_ID, C.EPISODE_RETURN, C.STEP, C.STEP_RETURN, C.ANCHOR_ID)


@dataclass(frozen=True)
class TrajectoryIndex:
    """Where each trajectory's trained tokens are: ``flat_NL`` (``row * T + position``, in order; 0 past
    ``lengths_N``), ``first_N`` (the row of its first segment, whose per-row columns it takes)."""

    flat_NL: torch.Tensor
    lengths_N: torch.Tensor
    first_N: torch.Tensor
    shape_BT: tuple[int, int]

    @property
    def mask_NL(self) -> torch.Tensor:
        positions_L = torch.arange(self.flat_NL.shape[1])
        return (positions_L.unsqueeze(0) < self.lengths_N.unsqueeze(1)).long()


def is_split(batch: Batch) -> bool:
    """Whether some trajectory of ``batch`` has more than one segment."""
    return C.SEGMENT in batch.tensors and bool((batch.tensors[C.SEGMENT] > 0).any())


def trajectory_index(batch: Batch) -> TrajectoryIndex:
    """The rows of each episode (``episode_id_B``) in segment order, and their trained positions."""
    t = batch.tensors
    mask_BT = t[C.RESPONSE_MASK].bool()
    B, T = mask_BT.shape
    rows: dict[int, list[tuple[int, int]]] = {}
    for b, (episode, segment) in enumerate(zip(t[C.EPISODE_ID].tolist(), t[C.SEGMENT].tolist())):
        rows.setdefault(int(episode), []).append((int(segment), b))
    flats, firsts = [], []
    for members in rows.values():
        ordered = [b for _, b in sorted(members)]
        firsts.append(ordered[0])
        flats.append(torch.cat([b * T + mask_BT[b].nonzero().flatten() for b in ordered]))
    lengths_N = torch.tensor([len(f) for f in flats], dtype=torch.long)
    flat_NL = torch.zeros((len(flats), max([1, *(len(f) for f in flats)])), dtype=torch.long)
    for n, f in enumerate(flats):
        flat_NL[n, : len(f)] = f
    return TrajectoryIndex(flat_NL, lengths_N, torch.tensor(firsts, dtype=torch.long), (B, T))


def pack(batch: Batch) -> tuple[Batch, TrajectoryIndex]:
    """One row per trajectory (see the module docstring): ``response_mask_BT`` over its trained tokens, the
    per-token columns gathered there, the per-row columns and ``tag`` of its first segment."""
    index = trajectory_index(batch)
    t, mask_NL = batch.tensors, index.mask_NL
    tensors = {C.RESPONSE_MASK: mask_NL}
    for name in PER_TOKEN:
        if name in t:
            tensors[name] = t[name].reshape(-1)[index.flat_NL] * mask_NL.to(t[name].dtype)
    tensors.update({name: t[name][index.first_N] for name in PER_ROW if name in t})
    non_tensors = {C.TAG: [batch[C.TAG][int(b)] for b in index.first_N]} if C.TAG in batch else {}
    return Batch(tensors, non_tensors), index


def unpack(packed_NL: torch.Tensor, index: TrajectoryIndex) -> torch.Tensor:
    """``[B, T]``: each trajectory's packed values back at its segments' trained positions, 0 elsewhere."""
    B, T = index.shape_BT
    out = torch.zeros(B * T, dtype=packed_NL.dtype)
    keep_NL = index.mask_NL.bool()
    out[index.flat_NL[keep_NL]] = packed_NL[keep_NL]
    return out.reshape(B, T)


def sequence_shares(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(seq_units_B, seq_tokens_B)``: ``1/k`` for each of the ``k`` rows of a trajectory, and its trained tokens
    over all of them (the columns :data:`~roll.core.columns.SEQ_UNITS`, :data:`~roll.core.columns.SEQ_TOKENS`)."""
    t = batch.tensors
    episode_B = t[C.EPISODE_ID]
    _, inverse_B, rows_E = torch.unique(episode_B, return_inverse=True, return_counts=True)
    row_tokens_B = t[C.RESPONSE_MASK].sum(dim=-1).to(torch.float32)
    tokens_E = torch.zeros(len(rows_E), dtype=torch.float32).index_add_(0, inverse_B, row_tokens_B)
    return 1.0 / rows_E[inverse_B].to(torch.float32), tokens_E[inverse_B]


def trajectory_advantages(objective: PolicyObjective, batch: Batch, **params: Any) -> Batch:
    """``objective``'s advantages (and returns) of ``batch``, one per trajectory: row by row when no trajectory
    was split (exactly as before), on :func:`pack`'s trajectory rows otherwise, where the rows also get their
    :func:`sequence_shares` so that the loss counts each trajectory once."""
    if not is_split(batch):
        return objective.advantages(batch, batch.tensors[C.SCORES], **params)
    batch[C.SEQ_UNITS], batch[C.SEQ_TOKENS] = sequence_shares(batch)
    packed, index = pack(batch)
    packed = objective.advantages(packed, packed.tensors[C.SCORES], **params)
    batch[C.ADVANTAGES] = unpack(packed.tensors[C.ADVANTAGES], index)
    if C.RETURNS in packed.tensors:
        batch[C.RETURNS] = unpack(packed.tensors[C.RETURNS], index)
    return batch
