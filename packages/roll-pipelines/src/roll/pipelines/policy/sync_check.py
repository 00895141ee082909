"""The check after a weight sync: does the generator now serve the trainer's policy?

After the first sync and every ``sync_check.every``-th one, :class:`SyncCheck` lets the generator decode one
fixed prompt greedily (``max_new_tokens`` tokens, EOS ignored, so the probe has the same length every time) and
the trainer score the same tokens. The generator's log-probs come with its samples (the ``hf`` strategy's decode loop and vLLM's
``processed_logprobs``, both of the sampled token before top-k/top-p truncation, at temperature 1 when greedy);
the trainer's from ``compute_logprobs`` at temperature 1. Over the probe's tokens::

    gap_t = |logp_trainer(y_t) - logp_generator(y_t)|

It logs ``mismatch/sync_logp_diff_mean`` and ``mismatch/sync_logp_diff_max`` and warns, with the numbers, when the
mean passes ``sync_check.threshold``: on the first such check, then once per ``warn_every`` of them, so a run with
a standing gap (bf16 generator, fp32 trainer) is told without being flooded. A gap right after a sync means the
generator serves other weights (a failed, partial or skipped sync; a dtype or kernel difference large enough to
bias the gradient); :mod:`roll.pipelines.algorithms.mismatch` measures the same thing on every training batch.

The probe is the prompt of the first row of the first batch the policy trains on (kept for the run, so the gap
is comparable step to step). Batches with images or videos are not probed (the probe carries no media).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from roll.core import columns as C
from roll.core.batch import Batch
from roll.pipelines.policy.config import SyncCheckConfig
from roll.pipelines.policy.views import training_view
from roll.workers.config import SamplingParams

if TYPE_CHECKING:
    from roll.workers.roles.clusters import GenerateCluster, TrainCluster

logger = logging.getLogger(__name__)


def probe_prompt(batch: Batch) -> list[int] | None:
    """Row 0's prompt: its tokens before the first response token (None for a batch with images or videos)."""
    if any(c in batch.non_tensors for c in C.VISION_COLUMNS) or len(batch) == 0:
        return None
    keep_T = np.asarray(batch.tensors[C.ATTENTION_MASK][0]).astype(bool)
    ids_T = np.asarray(batch.tensors[C.INPUT_IDS][0])[keep_T]
    response_T = np.asarray(batch.tensors[C.RESPONSE_MASK][0])[keep_T].astype(bool)
    first = int(np.flatnonzero(response_T)[0]) if bool(response_T.any()) else len(ids_T)
    return [int(t) for t in ids_T[:first].tolist()] or None


def measure_gap(
    actor: TrainCluster, infer: GenerateCluster, prompt_ids: list[int], max_new_tokens: int
) -> dict[str, float]:
    """Greedy-decode ``prompt_ids`` on ``infer``, score the tokens on ``actor``; the gap's mean and max."""
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True, seed=0)
    samples = infer.generate(Batch({}, {C.PROMPT_IDS: [prompt_ids]}), params)
    seq: Batch = actor.apply(probe_sequences, samples.slice(0, 1))
    trainer = actor.compute_logprobs(training_view(seq, (C.INPUT_IDS, C.ATTENTION_MASK)))
    gap: dict[str, float] = actor.apply(logp_gap, trainer, seq)
    return gap


def probe_sequences(samples: Batch) -> Batch:
    """The probe's padded sequences (in the train actor: :func:`~roll.data.sequences.to_sequences`)."""
    from roll.data.sequences import to_sequences

    return to_sequences(samples.to_torch(), pad_token_id=0)


def logp_gap(trainer: Batch, seq: Batch) -> dict[str, float]:
    """Mean and max of ``|logp_trainer - logp_generator|`` over the probe's response tokens (in the train actor)."""
    trainer_BT, seq = trainer.to_torch().tensors[C.LOGP], seq.to_torch()
    mask_BT = seq.tensors[C.RESPONSE_MASK].bool()
    gap_N = (trainer_BT.float()[mask_BT] - seq.tensors[C.INFER_LOGP][mask_BT]).abs()
    return {
        "mismatch/sync_logp_diff_mean": float(gap_N.mean()) if gap_N.numel() else 0.0,
        "mismatch/sync_logp_diff_max": float(gap_N.max()) if gap_N.numel() else 0.0,
        "mismatch/sync_probe_tokens": float(gap_N.numel()),
    }


class SyncCheck:
    """See the module docstring. :meth:`remember` sees every trained batch; :meth:`after_sync` runs the check."""

    def __init__(self, cfg: SyncCheckConfig) -> None:
        self.cfg = cfg
        self.prompt_ids: list[int] | None = None
        self.syncs = 0
        self.over = 0

    def state_dict(self) -> dict[str, Any]:
        return {"prompt_ids": self.prompt_ids, "syncs": self.syncs, "over": self.over}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.prompt_ids = list(state["prompt_ids"]) if state["prompt_ids"] is not None else None
        self.syncs, self.over = int(state["syncs"]), int(state["over"])

    def remember(self, batch: Batch) -> None:
        if self.prompt_ids is None and self.cfg.every > 0:
            self.prompt_ids = probe_prompt(batch)

    def after_sync(self, actor: TrainCluster, infer: GenerateCluster, version: int) -> dict[str, float]:
        """The gap metrics when this sync is one to check (and a probe is known), else ``{}``."""
        if self.prompt_ids is None or self.cfg.every == 0:
            return {}
        self.syncs += 1
        if self.syncs > 1 and self.syncs % self.cfg.every:  # the first sync always: a sync that never worked
            return {}
        return self.check(actor, infer, version)

    def check(self, actor: TrainCluster, infer: GenerateCluster, version: int) -> dict[str, float]:
        """Measure now (whatever ``every`` says) and warn past the threshold; needs a probe (:meth:`remember`)."""
        assert self.prompt_ids is not None, "no probe prompt yet: the policy has not trained on a batch"
        metrics = measure_gap(actor, infer, self.prompt_ids, self.cfg.max_new_tokens)
        mean, worst = metrics["mismatch/sync_logp_diff_mean"], metrics["mismatch/sync_logp_diff_max"]
        if mean > self.cfg.threshold:
            self.over += 1
            if self.over % self.cfg.warn_every == 1 or self.cfg.warn_every == 1:
                logger.warning(
                    "weight sync check at policy version %d: on one prompt the generator's log-probs differ from "
                    "the trainer's by %.4g on average (max %.4g over %d tokens), past sync_check.threshold = %g "
                    "(%d checks past it so far; shown once per %d). The generator may serve other weights than the "
                    "trainer (a failed or skipped sync) or a numerically different model (dtype, kernels); the "
                    "per-step mismatch/* metrics and docs/mismatch.md say how much it matters",
                    version, mean, worst, int(metrics["mismatch/sync_probe_tokens"]), self.cfg.threshold,
                    self.over, self.cfg.warn_every,
                )  # fmt: skip
        return metrics
