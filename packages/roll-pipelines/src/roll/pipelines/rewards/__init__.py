"""Verifiable reward functions: the scoring cores that reward workers call (no Ray here).

Interface in :mod:`~roll.pipelines.rewards.types`; configs in :mod:`~roll.pipelines.rewards.config`; entry-point
specs in :mod:`~roll.pipelines.rewards.specs`. Rewards: ``math``, ``code_sandbox`` (:mod:`.code` over
:mod:`.sandbox`), ``llm_judge`` (:mod:`.judge`), ``ifeval``, ``arithmetic``, ``exact_match`` (:mod:`.exact`) and
``python`` (:mod:`.python`: a user's function). :mod:`.check` validates reward options at load time. Importing
this package is light.
"""

from roll.pipelines.rewards.types import RewardFunction, RewardRequest, RewardResult

__all__ = ["RewardFunction", "RewardRequest", "RewardResult"]
