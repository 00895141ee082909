"""Loading a run's config: compose YAML, apply command-line overrides, interpolate, validate.

The stages run in that order, so an override can change what ``defaults:`` pulled in and what ``${...}``
references see. Each stage reports all of its problems at once as a :class:`ConfigError` whose ``str`` is the
report ``roll validate`` prints; a later stage does not run on the output of a failed one, to avoid errors that
are only echoes. This module imports neither torch nor Ray: validating a config takes milliseconds.

Typical use::

    config = load_config("examples/quickstart.yaml", ["max_steps=10"], model=RLVRConfig)
    (config.output_dir / "config.yaml").write_text(dump_yaml(config))

When the model depends on the tree (the ``pipeline:`` key picks it), load the tree first, then validate::

    tree = load_tree(path, overrides)
    config = validate(tree, spec_for(tree.data["pipeline"]).config_model)
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, overload

import yaml
from pydantic import BaseModel

from roll.core.config.compose import compose
from roll.core.config.interpolate import interpolate
from roll.core.config.overrides import apply_overrides
from roll.core.config.schema import field_names
from roll.core.config.sections import RunConfig
from roll.core.config.validate import validate_data
from roll.core.config.yaml_tree import nearest_source

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class ConfigTree:
    """A composed, overridden and interpolated config before validation.

    ``data`` is plain YAML data; ``sources`` maps each dotted key path (``""`` is the root file) to where it
    was written: ``conf/base.yaml:12`` or ``<override 2: a.b=3>``.
    """

    data: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)

    def source(self, path: str) -> str | None:
        """Where ``path`` was written or, when it was not (a default), where its closest parent was."""
        return nearest_source(self.sources, path)


def load_tree(
    path: str | Path, overrides: Sequence[str] = (), *, model: type[BaseModel] | None = None
) -> ConfigTree:
    """Compose ``path`` (its ``defaults:``, recursively), apply ``overrides``, resolve ``${...}``.

    With ``model``, an override may set a key the model declares even when no YAML file wrote it (it would
    otherwise need ``+``), and one that sets a key the model moved (a :class:`RunConfig`'s ``moved_keys``) gets
    the new path as hint. Raises :class:`ConfigError`.
    """
    data, sources = compose(path)

    def declared(keys: Sequence[str]) -> Collection[str]:
        return field_names(model, keys, data) if model is not None else ()

    moved = model.moved_keys() if model is not None and issubclass(model, RunConfig) else {}
    apply_overrides(data, sources, list(overrides), declared, moved)
    interpolate(data, sources)
    return ConfigTree(data, sources)


def validate(tree: ConfigTree, model: type[M]) -> M:
    """Validate a loaded tree as ``model``; every issue, with key path and ``file:line``, in one ConfigError."""
    return validate_data(tree.data, model, tree.sources)


@overload
def load_config(path: str | Path, overrides: Sequence[str] = (), model: None = None) -> RunConfig: ...


@overload
def load_config(path: str | Path, overrides: Sequence[str], model: type[M]) -> M: ...


@overload
def load_config(path: str | Path, overrides: Sequence[str] = (), *, model: type[M]) -> M: ...


def load_config(
    path: str | Path, overrides: Sequence[str] = (), model: type[BaseModel] | None = None
) -> BaseModel:
    """:func:`load_tree` then :func:`validate`: the frozen, validated config (``model`` defaults to RunConfig)."""
    schema = model or RunConfig
    return validate(load_tree(path, overrides, model=schema), schema)


def dump_yaml(config: BaseModel) -> str:
    """The resolved config as YAML (paths as strings, defaults filled in), in field order.

    Pipelines save it in their output directory; loading it back gives an equal config.
    """
    data = config.model_dump(mode="json")
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)
