"""Samples to a right-padded :class:`~roll.core.batch.Batch` in the worker roles' column layout.

Columns (``roll.core.columns`` names where one exists):

- ``input_ids_BT``, ``attention_mask_BT``; ``response_mask_BT``: the loss mask (1 on model-sampled tokens only);
  ``infer_logp_BT``: the sampler's log-probs there (0 elsewhere);
- ``rewards_BT``: the sample's reward on its last trained token, 0 elsewhere (of a trajectory split into
  segments, only on its last segment's: a return is counted once per trajectory); ``scores_B``: that reward
  (on every segment of a trajectory, since each is trained towards it);
- ``group_id_B`` (episode group: envs that shared a seed), ``episode_id_B``, ``segment_B``, ``step_B``, ``anchor_id_B``,
  ``step_return_B``, ``episode_return_B``; non-tensor ``tag`` and ``success``;
- rows of image observations: the non-tensor vision columns ``pixel_values`` and ``image_grid_thw`` per row
  (None for a text row); a batch of text rows has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from roll.agentic.env_manager.chat import vision_rows
from roll.agentic.env_manager.episode import Sample
from roll.core import columns as C
from roll.core.batch import Batch

__all__ = [
    "to_batch",
]


def to_batch(samples: Sequence[Sample], pad_token_id: int) -> Batch:
    """Right-padded ``[B, T]`` tensors of ``samples`` (see the module docstring for the columns)."""
    B, T = len(samples), max((len(s.input_ids) for s in samples), default=0)
    ids_BT = torch.full((B, T), pad_token_id, dtype=torch.long)
    attn_BT = torch.zeros((B, T), dtype=torch.long)
    mask_BT = torch.zeros((B, T), dtype=torch.long)
    logp_BT = torch.zeros((B, T), dtype=torch.float32)
    rewards_BT = torch.zeros((B, T), dtype=torch.float32)
    last_segment: dict[int, int] = {}
    for s in samples:
        last_segment[s.episode] = max(last_segment.get(s.episode, 0), s.segment)
    for b, s in enumerate(samples):
        n = len(s.input_ids)
        ids_BT[b, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        attn_BT[b, :n] = 1
        mask_BT[b, :n] = torch.tensor(s.loss_mask, dtype=torch.long)
        logp_BT[b, :n] = torch.tensor(s.logp, dtype=torch.float32)
        trained = [t for t, m in enumerate(s.loss_mask) if m]
        if trained and s.segment == last_segment[s.episode]:
            rewards_BT[b, trained[-1]] = s.score
    tensors = {
        C.INPUT_IDS: ids_BT,
        C.ATTENTION_MASK: attn_BT,
        C.RESPONSE_MASK: mask_BT,
        C.INFER_LOGP: logp_BT,
        C.TOKEN_REWARDS: rewards_BT,
        C.SCORES: _floats([s.score for s in samples]),
        C.GROUP_ID: torch.tensor([s.group for s in samples], dtype=torch.long),
        C.EPISODE_ID: torch.tensor([s.episode for s in samples], dtype=torch.long),
        C.SEGMENT: torch.tensor([s.segment for s in samples], dtype=torch.long),
        C.STEP: torch.tensor([s.step for s in samples], dtype=torch.long),
        C.ANCHOR_ID: torch.tensor([s.anchor for s in samples], dtype=torch.long),
        C.STEP_RETURN: _floats([s.step_return for s in samples]),
        C.EPISODE_RETURN: _floats([s.episode_return for s in samples]),
        C.POLICY_VERSION: torch.tensor([s.policy_version for s in samples], dtype=torch.long),
    }
    non_tensors: dict[str, list[Any]] = {
        C.TAG: [s.tag for s in samples],
        C.SUCCESS: [s.success for s in samples],
        **vision_rows([s.images for s in samples]),
    }
    return Batch(tensors, non_tensors)


def _floats(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)
