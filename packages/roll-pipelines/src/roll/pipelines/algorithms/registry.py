"""Registries of the advantage estimators and policy losses, by name; torch-free.

An entry states its name, a one-line description and what it needs from the pipeline:

- ``critic``: a value model (GAE reads its values, a critic role trains on the returns);
- ``groups``: several samples per prompt (or env seed) carrying a ``group_id_B``, to compare within a group;
- ``reference``: a frozen reference policy (none of the estimators or losses below needs one by itself; KL to
  the reference is ``algorithm.kl_mode``, orthogonal to both).

The implementations attach to their entry with :meth:`Registry.bind` in the tensor modules
(:mod:`.estimators`, :mod:`.losses`), so config validation (``roll validate``) reads names, needs and
descriptions without importing torch. A pipeline declares the names it supports; :meth:`Registry.unsupported`
turns a choice outside them into a config issue whose message lists the supported entries with their
descriptions. Unknown names raise and list the known ones; a second implementation of one name raises naming
both.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from roll.core.errors import ConfigError, ConfigIssue
from roll.pipelines.algorithms.choices import (
    AdvEstimator,
    LossAggMode,
    MismatchCorrectionType,
    PolicyLossType,
)

Need = Literal["critic", "groups", "reference"]

__all__ = ["ESTIMATORS", "MISMATCH_CORRECTIONS", "POLICY_LOSSES", "Entry", "Need", "Registry"]


@dataclass(frozen=True)
class Entry:
    """One registered algorithm: its name, what it needs, and a line for messages and ``roll list``.

    Policy losses also state what their formula assumes of the config: ``aggregation``, the one
    ``algorithm.loss_agg_mode`` the loss is defined with (a config that sets another is rejected); ``defaults``,
    ``AlgorithmConfig`` values the loss fills under the keys a config (or its preset) did not set, such as GSPO's
    clip ranges; ``batch_coupled``, true when a token's loss depends on other rows of the micro-batch (so no row
    may be left out of the forward as inert).
    """

    name: str
    description: str
    needs: frozenset[Need] = frozenset()
    aggregation: LossAggMode | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    batch_coupled: bool = False

    def line(self) -> str:
        needs = f" [needs {', '.join(sorted(self.needs))}]" if self.needs else ""
        agg = f" [loss_agg_mode {self.aggregation}]" if self.aggregation else ""
        return f"{self.name}: {self.description}{needs}{agg}"


class Registry:
    """Entries of one kind (``advantage estimator``, ``policy loss``) by name, and their implementations."""

    def __init__(self, kind: str, key: str, entries: Iterable[Entry]) -> None:
        self.kind, self.key = kind, key
        self._entries = {e.name: e for e in entries}
        self._impls: dict[str, Callable[..., Any]] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def entry(self, name: str) -> Entry:
        """The entry ``name``; an unknown name raises :class:`ConfigError` listing the known ones."""
        if name not in self._entries:
            known = "\n  ".join(e.line() for e in self._entries.values())
            raise ConfigError(f"unknown {self.kind} {name!r} ({self.key}); known:\n  {known}")
        return self._entries[name]

    def bind(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: ``fn`` implements entry ``name`` (which must exist; a second implementation raises)."""
        self.entry(name)

        def attach(fn: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._impls:
                first = self._impls[name]
                raise ConfigError(
                    f"{self.kind} {name!r} is implemented twice: {first.__module__}.{first.__qualname__} and "
                    f"{fn.__module__}.{fn.__qualname__}"
                )
            self._impls[name] = fn
            return fn

        return attach

    def implementation(self, name: str) -> Callable[..., Any]:
        """The function bound to ``name`` (its tensor module must have been imported)."""
        self.entry(name)
        if name not in self._impls:
            raise ConfigError(f"{self.kind} {name!r} has no implementation bound (import its tensor module)")
        return self._impls[name]

    def check_bound(self) -> None:
        """Raise unless every entry has an implementation (called once its tensor module has bound them)."""
        missing = sorted(set(self._entries) - set(self._impls))
        if missing:
            raise ConfigError(f"{self.kind} entries without an implementation: {missing}")

    def unsupported(self, name: str, supported: Collection[str], *, pipeline: str) -> list[ConfigIssue]:
        """A config issue at :attr:`key` when ``name`` is not in ``supported`` (a pipeline's declaration)."""
        if name in supported:
            return []
        entry = self.entry(name)
        why = f" (it needs {', '.join(sorted(entry.needs))})" if entry.needs else ""
        listed = "; ".join(self.entry(n).line() for n in supported)
        message = f"{self.kind} {name!r} is not supported by the {pipeline} pipeline{why}"
        return [ConfigIssue(self.key, message, f"use one of: {listed}")]


ESTIMATORS = Registry(
    "advantage estimator",
    "algorithm.adv_estimator",
    [
        Entry(
            "gae", "GAE on the critic's values (Schulman et al. 2016), PPO's estimator", frozenset({"critic"})
        ),
        Entry(
            "grpo", "(r - mean_g) / (std_g + eps) within each group (Shao et al. 2024)", frozenset({"groups"})
        ),
        Entry(
            "dr_grpo",
            "r - mean_g within each group, no std division (Liu et al. 2025)",
            frozenset({"groups"}),
        ),
        Entry(
            "rloo",
            "r minus the mean of the group's other rewards (Ahmadian et al. 2024)",
            frozenset({"groups"}),
        ),
        Entry("reinforce_pp", "discounted token returns, whitened over the batch (Hu 2025)"),
        Entry(
            "reinforce_pp_baseline",
            "r - mean_g broadcast to tokens, whitened over the batch",
            frozenset({"groups"}),
        ),
        Entry(
            "gigpo",
            "episode-group advantage + step_weight * anchor-state-group advantage (Feng et al. 2025)",
            frozenset({"groups"}),
        ),
    ],
)

POLICY_LOSSES = Registry(
    "policy loss",
    "algorithm.loss_type",
    [
        Entry("ppo", "clipped ratio surrogate (clip-higher, dual-clip)"),
        Entry(
            "gspo",
            "sequence-level ratio, clipped (Zheng et al. 2025)",
            aggregation="seq-mean-token-mean",
            defaults={"clip_low": 3e-4, "clip_high": 4e-4},
        ),
        Entry("cispo", "clipped, detached IS weight times log-prob (MiniMax-M1 2025)"),
        Entry("topr", "truncated off-policy REINFORCE, no clipping (Le Roux et al. 2025)"),
        Entry(
            "sapo",
            "smooth temperature gate on the token ratio instead of a clip (Gao et al. 2025, Qwen)",
            defaults={"loss_agg_mode": "seq-mean-token-mean"},
        ),
        Entry(
            "gmpo",
            "geometric mean of the token ratios, clipped in log space (Zhao et al. 2025)",
            aggregation="seq-mean-token-mean",
            defaults={"clip_low": 0.4, "clip_high": 0.4},
        ),
        Entry(
            "clip_cov",
            "PPO clip, plus no gradient on a few random high-covariance tokens (Cui et al. 2025)",
            batch_coupled=True,
        ),
        Entry(
            "kl_cov",
            "unclipped surrogate, plus |log ratio| penalty on the top-covariance tokens (Cui et al. 2025)",
            batch_coupled=True,
        ),
    ],
)

MISMATCH_CORRECTIONS = Registry(
    "mismatch correction",
    "algorithm.mismatch_correction.type",
    [
        Entry("tis", "truncated IS weight min(rho, high), token or sequence ratio (Yao et al. 2025)"),
        Entry("mis", "masked IS: weight rho inside [low, high], 0 outside; token or sequence ratio"),
        Entry("icepop", "two-sided token mask: 1 inside [low, high], 0 outside, no reweighting (IcePop)"),
    ],
)
"""Corrections of the train/infer mismatch (``rho = pi_old / pi_infer``); implementations in :mod:`.mismatch`."""

if set(ESTIMATORS.names) != set(get_args(AdvEstimator)):
    raise ConfigError(
        f"ESTIMATORS {ESTIMATORS.names} and choices.AdvEstimator {get_args(AdvEstimator)} differ"
    )
if set(POLICY_LOSSES.names) != set(get_args(PolicyLossType)):
    raise ConfigError(
        f"POLICY_LOSSES {POLICY_LOSSES.names} and PolicyLossType {get_args(PolicyLossType)} differ"
    )
if set(MISMATCH_CORRECTIONS.names) != set(get_args(MismatchCorrectionType)):
    raise ConfigError(
        f"MISMATCH_CORRECTIONS {MISMATCH_CORRECTIONS.names} and MismatchCorrectionType "
        f"{get_args(MismatchCorrectionType)} differ"
    )
