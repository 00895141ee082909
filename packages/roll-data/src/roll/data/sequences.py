"""Generated samples (ragged token lists) to the padded ``[B, T]`` layout that training and scoring read.

A driver-side data step: a pipeline calls :func:`to_sequences` on what its generators returned, before it scores
and trains on the rows (the inference role only samples; the train roles only read the padded columns).
"""

from __future__ import annotations

import torch

from roll.core import columns as C
from roll.core.batch import Batch


def to_sequences(samples: Batch, pad_token_id: int) -> Batch:
    """Right-padded prompt + response rows, with response mask and the sampler's log-probs aligned.

    Adds ``input_ids_BT``, ``attention_mask_BT``, ``response_mask_BT`` and ``infer_logp_BT`` (the log-prob of
    token ``t`` at column ``t``, 0 outside the response) to a copy of ``samples`` (an ``ActorInferWorker.generate``
    result). ``T`` is the longest prompt + response.
    """
    prompts = samples.non_tensors[C.PROMPT_IDS]
    responses = samples.non_tensors[C.RESPONSE_IDS]
    logps = samples.non_tensors[C.RESPONSE_LOGP]
    T = max((len(p) + len(r) for p, r in zip(prompts, responses)), default=0)
    B = len(samples)
    ids_BT = torch.full((B, T), pad_token_id, dtype=torch.long)
    mask_BT = torch.zeros((B, T), dtype=torch.long)
    resp_BT = torch.zeros((B, T), dtype=torch.long)
    logp_BT = torch.zeros((B, T), dtype=torch.float32)
    for b, (p, r, lp) in enumerate(zip(prompts, responses, logps)):
        P, R = len(p), len(r)
        ids_BT[b, : P + R] = torch.tensor(list(p) + list(r), dtype=torch.long)
        mask_BT[b, : P + R] = 1
        resp_BT[b, P : P + R] = 1
        logp_BT[b, P : P + R] = torch.tensor(lp, dtype=torch.float32)
    out = Batch(dict(samples.tensors), dict(samples.non_tensors), samples.meta)
    out[C.INPUT_IDS], out[C.ATTENTION_MASK] = ids_BT, mask_BT
    out[C.RESPONSE_MASK], out[C.INFER_LOGP] = resp_BT, logp_BT
    return out
