"""The extension points of roll and the objects their entry points name.

Map of the abstractions:

- ``roll.pipeline`` -> :class:`PipelineSpec`: a name, a config model (a :class:`RunConfig` subclass) and
  ``build(config) -> Pipeline``. The ``pipeline:`` key of a YAML file picks one.
- ``roll.strategy`` -> :class:`StrategySpec`: a train or infer backend (hf, fsdp2, vllm, megatron).
- ``roll.reward`` -> :class:`RewardSpec`: a reward-worker factory (math, code_sandbox, llm_judge, ...).
- ``roll.diffusion_reward`` -> :class:`RewardSpec`: an image or video reward of roll-diffusion (shape_alignment,
  jpeg_compressibility, clip).
- ``roll.env`` -> :class:`EnvSpec`: an environment factory.
- ``roll.tool`` -> :class:`ToolSpec`: a tool factory.
- ``roll.tracker`` -> :class:`TrackerSpec`: a metrics sink (stdout, jsonl, tensorboard, wandb).

Specs are light: their modules import no torch, vLLM or Megatron; only ``build`` does. :mod:`roll.core.plugins`
checks each loaded object against the spec type of its group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from roll.core.config.sections import RunConfig
    from roll.core.errors import ConfigIssue


@runtime_checkable
class Pipeline(Protocol):
    """A built pipeline: ``run`` trains until done and returns a summary; ``shutdown`` frees its actors."""

    def run(self) -> Mapping[str, Any]: ...

    def shutdown(self) -> None: ...


@runtime_checkable
class Tracker(Protocol):
    """A metrics sink. ``log`` receives flat ``{"group/name": float}`` dicts.

    Optional methods, called when a tracker has them (:class:`roll.core.tracking.MultiTracker`); without them a
    tracker does nothing with those calls: ``log_images({name: png_path}, step)``, ``log_samples(rows, step,
    kind)`` (sample rows, :mod:`roll.core.samples`: shown as a table or text) and ``rewind(last_step)``."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


ExportHook = Callable[[Any, Path, Path, str | None], str]
"""``export(config, checkpoint_dir, out_dir, role) -> how_to_load``: see :attr:`PipelineSpec.export`."""


@dataclass(frozen=True)
class PipelineSpec:
    """A training mode. ``preflight(config)`` (optional) checks what the config model cannot see alone, such as
    the first rows of every data source against the fields the config maps, or a reward's options against its
    plugin's model; it returns every problem found and runs in ``roll validate`` and in ``roll train`` before
    Ray starts. ``explain(config)`` (optional) returns lines saying what presets and defaults set, for
    ``roll validate --explain``. ``export(config, checkpoint_dir, out_dir, role)`` (optional) writes the model of
    a verified checkpoint of this pipeline into ``out_dir`` as a folder that transformers (or diffusers) loads
    without roll, from ``config`` (the run's, validated against ``config_model``); ``role`` is ``roll export
    --role`` (None: the mode's trained model) and an unknown one raises a ConfigError listing the mode's roles.
    It returns one line saying what was written and how to load it, ``{out}`` standing for the final folder
    (``out_dir`` is a staging dir that ``roll export`` renames when the hook returns). All three live with the pipeline, so core
    never imports one."""

    name: str
    config_model: type[RunConfig]
    build: Callable[[Any], Pipeline]
    description: str = ""
    preflight: Callable[[Any], Sequence[ConfigIssue]] | None = None
    explain: Callable[[Any], Sequence[str]] | None = None
    export: ExportHook | None = None


@dataclass(frozen=True)
class StrategySpec:
    name: str
    kind: Literal["train", "infer"]
    config_model: type[Any]
    build: Callable[..., Any]
    description: str = ""
    extra: str | None = None  # the pip extra that provides its backend, e.g. "vllm"


@dataclass(frozen=True)
class RewardSpec:
    name: str
    build: Callable[..., Any]
    config_model: type[Any] | None = None
    description: str = ""


@dataclass(frozen=True)
class EnvSpec:
    name: str
    build: Callable[..., Any]
    config_model: type[Any] | None = None
    description: str = ""


@dataclass(frozen=True)
class ToolSpec:
    name: str
    build: Callable[..., Any]
    config_model: type[Any] | None = None
    description: str = ""


@dataclass(frozen=True)
class TrackerSpec:
    name: str
    build: Callable[..., Tracker]
    description: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)


GROUPS: dict[str, type[Any]] = {
    "roll.pipeline": PipelineSpec,
    "roll.strategy": StrategySpec,
    "roll.reward": RewardSpec,
    "roll.diffusion_reward": RewardSpec,
    "roll.env": EnvSpec,
    "roll.tool": ToolSpec,
    "roll.tracker": TrackerSpec,
}
"""Every entry-point group and the spec type its objects must be."""
