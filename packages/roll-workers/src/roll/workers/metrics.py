"""Unit-weighted means of loss metrics over the micro-batches of one optimizer step.

A :class:`~roll.workers.types.LossFn` returns, with its loss sum, metrics that are *means over the micro-batch's
units* (``count_units``). A step's value of a metric is then the mean over all of the step's units on this rank:
``sum_i m_i * u_i / sum_i u_i``, except for names that :func:`roll.core.tracking.reduction_for` reduces by max
or min (``ratio_max``, ``.../logp_abs_diff_max``): those take the max (min) over the micro-batches that
reported them, as they are across ranks. Micro-batches with zero weight (the padding micro-batches that equalize ranks,
or a rank with only padding rows) add nothing. Across ranks the pipeline reduces with
:func:`roll.core.tracking.reduce_metrics` as for every other metric.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from roll.core.tracking import reduction_for

if TYPE_CHECKING:
    import torch

__all__ = ["LossMetrics", "UnitWeightedMeans"]

LossMetrics = Mapping[str, "torch.Tensor | float"]
"""What a loss reports for one micro-batch: detached scalars, each a mean over the micro-batch's units."""


class UnitWeightedMeans:
    """Accumulates ``metrics * units`` per name; :meth:`means` divides by the units that reported the name.
    Max/min names (by suffix) keep their extreme instead."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._units: dict[str, float] = {}
        self._extremes: dict[str, float] = {}

    def add(self, metrics: LossMetrics, units: float) -> None:
        """Fold in one micro-batch's metrics, weighted by its ``units`` (nothing when ``units`` is 0)."""
        if units <= 0:
            return
        for name, value in metrics.items():
            mode = reduction_for(name)
            if mode in ("max", "min"):
                seen = self._extremes.get(name)
                pick = max if mode == "max" else min
                self._extremes[name] = float(value) if seen is None else pick(seen, float(value))
                continue
            self._sums[name] = self._sums.get(name, 0.0) + float(value) * units
            self._units[name] = self._units.get(name, 0.0) + units

    def means(self) -> dict[str, float]:
        """The unit-weighted mean of every metric seen, the extreme of max/min names (``{}`` when none had
        units)."""
        out = {name: total / self._units[name] for name, total in self._sums.items()}
        return {**out, **self._extremes}
