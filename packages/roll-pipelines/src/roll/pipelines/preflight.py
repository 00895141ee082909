"""Pre-flight checks of the ``rlvr`` pipeline: what its config model cannot see alone, run before Ray starts.

``roll validate`` and ``roll train`` call :func:`rlvr_preflight` through the pipeline spec's ``preflight`` hook:

- every reward domain's plugin and options (:func:`roll.pipelines.rewards.check.reward_issues`).
"""

from __future__ import annotations

from typing import Any

from roll.core.errors import ConfigIssue
from roll.pipelines.rewards.check import reward_issues


def rlvr_preflight(config: Any) -> list[ConfigIssue]:
    """Every problem found in the reward domains and the first rows of the data sources."""
    return reward_issues(config.rewards)
