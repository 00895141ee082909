"""Typed, strict, immutable configs, and the loader that turns YAML plus overrides into them.

- :mod:`~roll.core.config.base`: :class:`RollModel`, the base of every config section.
- :mod:`~roll.core.config.sections`: sections every run shares (:class:`RunConfig` and its parts).
- :mod:`~roll.core.config.batch`: :class:`BatchConfig`, batch sizes stated once and checked with arithmetic.
- :mod:`~roll.core.config.loader`: ``load_tree`` / ``validate`` / ``load_config`` / ``dump_yaml``; built on
  ``compose`` (``defaults:`` lists), ``overrides`` (``a.b=1``), ``interpolate`` (``${a.b}``), ``validate``
  (pydantic errors as :class:`~roll.core.errors.ConfigIssue`) and ``yaml_tree`` (line numbers).

Nothing here imports torch or Ray.
"""

from roll.core.config.base import RollModel
from roll.core.config.batch import BatchConfig, DerivedBatch
from roll.core.config.loader import ConfigTree, dump_yaml, load_config, load_tree, validate
from roll.core.config.sections import CheckpointConfig, RayConfig, RoleConfig, RunConfig, TrackingConfig
from roll.core.config.validate import issues_error

__all__ = [
    "BatchConfig",
    "CheckpointConfig",
    "ConfigTree",
    "DerivedBatch",
    "RayConfig",
    "RoleConfig",
    "RollModel",
    "RunConfig",
    "TrackingConfig",
    "dump_yaml",
    "issues_error",
    "load_config",
    "load_tree",
    "validate",
]
