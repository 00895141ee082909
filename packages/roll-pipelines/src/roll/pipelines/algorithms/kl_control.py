"""The KL coefficient's controllers (fixed, or adaptive after Ziegler et al. 2019): plain Python, no torch, so the
driver that holds them (their state is checkpointed with the run) need not import it. Re-exported by :mod:`.kl`.
"""

from __future__ import annotations

from typing import Protocol

from roll.core.errors import ConfigError

__all__ = ["AdaptiveKLController", "FixedKLController", "KLController", "build_kl_controller"]


class KLController(Protocol):
    """The KL coefficient source: ``value`` now, ``update`` after each step, checkpointable state."""

    @property
    def value(self) -> float: ...

    def update(self, current_kl: float, n_steps: int) -> None: ...

    def state_dict(self) -> dict[str, float]: ...

    def load_state_dict(self, state: dict[str, float]) -> None: ...


class FixedKLController:
    """A constant coefficient."""

    def __init__(self, coef: float) -> None:
        if coef < 0:
            raise ConfigError(f"kl_coef must be >= 0, got {coef}")
        self._value = float(coef)

    @property
    def value(self) -> float:
        return self._value

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self._value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self._value = float(state["value"])


class AdaptiveKLController:
    """Ziegler et al. 2019: steer the measured KL toward ``target`` with a proportional controller.

    ``e = clip(KL / target - 1, -0.2, 0.2)`` and ``beta <- beta * (1 + e * n_steps / horizon)``, where
    ``n_steps`` is the number of samples (or steps) since the last update and ``horizon`` the time constant.
    """

    def __init__(self, init_coef: float, target: float, horizon: int) -> None:
        if init_coef < 0 or target <= 0 or horizon <= 0:
            raise ConfigError(
                f"adaptive KL needs init_coef >= 0, target > 0 and horizon > 0; "
                f"got init_coef={init_coef}, target={target}, horizon={horizon}"
            )
        self._value = float(init_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    @property
    def value(self) -> float:
        return self._value

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self._value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self._value, "target": self.target, "horizon": float(self.horizon)}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self._value = float(state["value"])
        self.target = float(state["target"])
        self.horizon = int(state["horizon"])


def build_kl_controller(coef: float, *, target: float | None = None, horizon: int = 10000) -> KLController:
    """An :class:`AdaptiveKLController` when ``target`` is given, else a :class:`FixedKLController`."""
    if target is None:
        return FixedKLController(coef)
    return AdaptiveKLController(coef, target, horizon)
