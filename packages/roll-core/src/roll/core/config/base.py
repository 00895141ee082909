"""The base of every config model: strict, immutable, side-effect free.

``extra="forbid"`` rejects unknown keys (the loader turns them into did-you-mean hints); ``frozen=True`` makes a
loaded config immutable; ``validate_default=True`` checks defaults as strictly as user input. Config modules import
neither torch nor Ray, so ``roll validate`` takes milliseconds.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RollModel(BaseModel):
    """Base class for roll config sections."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, populate_by_name=False)
