"""Batch columns the offline training modes add to those of :mod:`roll.workers.roles.columns`."""

from __future__ import annotations

from typing import Final

IGNORE_INDEX: Final = -100

LABELS: Final = "labels_BT"
"""Unshifted targets: the token itself where the loss is taken, ``-100`` elsewhere (prompt, padding). Since
``logp_BT[b, t]`` is the log-prob of token ``t``, ``labels_BT != -100`` is the loss mask of ``logp_BT``."""

REF_LOGP: Final = "ref_logp_B"
"""The reference model's response log-prob of each row (DPO), ``[B]``."""
