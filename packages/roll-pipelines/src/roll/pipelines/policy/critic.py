"""PPO's critic inside RLVR: values for GAE before the update, the clipped value loss after it.

A value head at position ``t`` has read the token of step ``t``; the value of the state the policy acted in is
one position to the left (:func:`~roll.pipelines.algorithms.value_loss.action_values`). Values, returns and the
value loss live on the response tokens only (``response_mask_BT``); the critic trains on the same mini-batches as
the actor, its calls queued on its own actors so that it trains while the actor does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import PendingCall
from roll.core.tracking import reduce_metrics
from roll.pipelines.policy.views import training_view
from roll.workers.types import LossFn

if TYPE_CHECKING:
    import torch

    from roll.workers.roles.clusters import CriticCluster

CRITIC_COLUMNS = (
    C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK, C.OLD_VALUES, C.RETURNS, C.SEQ_UNITS, C.SEQ_TOKENS,
)  # fmt: skip


def explained_variance(values_BT: torch.Tensor, returns_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """``1 - Var[R - V] / Var[R]`` over the masked tokens: 1 is a perfect critic, 0 no better than a constant,
    below 0 worse than one. ``nan`` when the returns do not vary."""
    from roll.pipelines.algorithms.aggregate import masked_var

    var_returns = masked_var(returns_BT, mask_BT)
    if float(var_returns) <= 0:
        return float("nan")
    return float(1 - masked_var(returns_BT - values_BT, mask_BT) / var_returns)


class Critic:
    """The critic cluster's two uses in a step: :meth:`values` and :meth:`train` / :meth:`collect`."""

    def __init__(self, cluster: CriticCluster, loss: LossFn) -> None:
        self.cluster, self.loss = cluster, loss
        self._pending: list[PendingCall[list[dict[str, float]]]] = []

    def values(self, batch: Batch) -> torch.Tensor:
        """``V_BT`` of the state before each response token (0 elsewhere), from the current critic; the shift
        and mask run on the critic (:func:`response_values`), where torch is."""
        seqs = training_view(batch, (C.INPUT_IDS, C.ATTENTION_MASK))
        values = self.cluster.compute_values(seqs)
        mask = Batch({C.RESPONSE_MASK: batch.tensors[C.RESPONSE_MASK]})
        out: torch.Tensor = self.cluster.apply(response_values, values, mask)
        return out

    def train(self, parts: Sequence[Batch]) -> None:
        """Queue one optimizer step per mini-batch (``old_values_BT`` and ``returns_BT`` set); returns at once."""
        self._pending = [
            self.cluster.train_step.submit(training_view(p, CRITIC_COLUMNS), self.loss) for p in parts
        ]

    def collect(self) -> dict[str, float]:
        """Wait for the queued steps; their metrics as ``critic/*`` (``critic/value_loss`` the loss)."""
        per_rank: list[dict[str, float]] = []
        for call in self._pending:
            per_rank += call.result()
        self._pending = []
        m = reduce_metrics(per_rank, how={"tokens": "sum"})
        out = {k: v for k, v in m.items() if k.startswith("critic/")}
        out.update({"critic/value_loss": m["loss"], "critic/grad_norm": m["grad_norm"], "critic/lr": m["lr"]})
        return out


def response_values(values: Batch, mask: Batch) -> torch.Tensor:
    """:func:`~roll.pipelines.algorithms.value_loss.action_values` of ``values_BT``, 0 off the response."""
    from roll.pipelines.algorithms.value_loss import action_values

    values_BT, mask_BT = values.to_torch().tensors[C.VALUES], mask.to_torch().tensors[C.RESPONSE_MASK]
    return action_values(values_BT) * mask_BT.float()


def batch_metrics(batch: Batch, mask_BT: torch.Tensor) -> dict[str, float]:
    """What the critic predicted for this batch, before training on it: values, returns, explained variance."""
    from roll.pipelines.algorithms.aggregate import masked_mean

    values_BT, returns_BT = batch.tensors[C.OLD_VALUES], batch.tensors[C.RETURNS]
    return {
        "critic/values_mean": float(masked_mean(values_BT, mask_BT)),
        "critic/returns_mean": float(masked_mean(returns_BT, mask_BT)),
        "critic/explained_variance": explained_variance(values_BT, returns_BT, mask_BT),
    }
