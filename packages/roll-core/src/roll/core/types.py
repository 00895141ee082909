"""The extension points of roll and the objects their entry points name.

Map of the abstractions:

- :class:`Recipe` (with its :class:`Phases`): what a training mode's step is; :class:`roll.core.run.Run` holds
  one and owns the run around it. A built :class:`Pipeline` is such a run.
- ``roll.pipeline`` -> :class:`PipelineSpec`: a name, a config model (a :class:`RunConfig` subclass) and
  ``build(config) -> Pipeline``. The ``pipeline:`` key of a YAML file picks one.
- ``roll.strategy`` -> :class:`StrategySpec`: a train or infer backend (hf, fsdp2, vllm, megatron).
- ``roll.reward`` -> :class:`RewardSpec`: a reward-worker factory (math, code_sandbox, llm_judge, ...).
- ``roll.diffusion_reward`` -> :class:`RewardSpec`: an image or video reward of roll-diffusion (shape_alignment,
  jpeg_compressibility, clip).
- ``roll.env`` -> :class:`EnvSpec`: an environment factory.
- ``roll.tool`` -> :class:`ToolSpec`: a tool factory.
- ``roll.tool_parser`` -> :class:`ToolParserSpec`: a tool-call format (hermes, qwen3_coder, llama3_json, mistral):
  how tools are described to the model, how its calls are written and read back.
- ``roll.agent`` -> :class:`AgentSpec`: user agent code that talks to roll's OpenAI-compatible gateway.
- ``roll.tracker`` -> :class:`TrackerSpec`: a metrics sink (stdout, jsonl, tensorboard, wandb).

Each spec's ``build`` is typed by a Protocol below (:class:`PipelineBuild`, :class:`StrategyBuild`,
:class:`RewardBuild`, :class:`EnvBuild`, :class:`ToolBuild`, :class:`ToolParserBuild`, :class:`TrackerBuild`) whose docstring is the contract a
plugin author implements; docs/plugins.md walks through one example package per group.

Specs are light: their modules import no torch, vLLM or Megatron; only ``build`` does. :mod:`roll.core.plugins`
checks each loaded object against the spec type of its group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from roll.core.config.sections import RoleConfig, RunConfig, TrackingConfig
    from roll.core.errors import ConfigIssue


@runtime_checkable
class Pipeline(Protocol):
    """A built pipeline: ``run`` trains until done and returns a summary; ``shutdown`` frees its actors."""

    def run(self) -> Mapping[str, Any]: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class Phases:
    """The optional phases of a :class:`Recipe`, declared: a phase left ``None`` is one the recipe does not have.

    - ``warm_up() -> ran``: after ``setup``, before step 0 of a fresh run, never on a resume (an SFT warm-up).
      The run logs ``time/warmup_s`` with step 1's metrics when it returns ``True``.
    - ``evaluate(step) -> metrics``: held-out metrics after ``step`` completed steps, every ``eval_every`` steps;
      logged under ``eval/``.
    - ``teardown()``: release what ``setup`` built besides its clusters (threads, schedulers, open files). Runs
      before a restart after a lost worker (``setup`` then runs again) and at shutdown, before the clusters stop.
    - ``export(output_dir)``: write the trained model as a ``save_pretrained`` folder (``checkpoint.export_hf``).
    - ``report()``: what the run writes when it ends, finished or not (a plot of its metrics); an error in it is
      logged, never raised.
    """

    warm_up: Callable[[], bool] | None = None
    evaluate: Callable[[int], Mapping[str, float]] | None = None
    teardown: Callable[[], None] | None = None
    export: Callable[[Path], None] | None = None
    report: Callable[[], None] | None = None


class Recipe(Protocol):
    """What one training mode is, for :class:`roll.core.run.Run`, which owns when it happens.

    A recipe is a plain class built with the run's config and its :class:`roll.core.run.RunHost` (clusters,
    tracker, samples, failure guard, output dir, seed, current step); it composes shared parts for the rest. The
    run calls ``roles`` before Ray places anything, ``setup`` once per attempt (again after a lost worker), then
    ``train_step(step)`` with the 0-based index of the step it runs. A checkpoint is ``save_files(dir)`` (model
    and optimizer files) plus ``state()`` (JSON-able: data position, scheduler state); a resume calls
    ``load_files`` and ``load_state`` after ``setup``. ``phases()`` declares the optional phases (:class:`Phases`)."""

    def roles(self) -> Mapping[str, RoleConfig]:
        """Every role this run places, by name (checked against the Ray cluster before any actor starts)."""
        ...

    def setup(self) -> None:
        """Start the role clusters (with ``host.make_cluster``) and load data. Runs once per attempt, before resume."""
        ...

    def train_step(self, step: int) -> Mapping[str, float]:
        """Run training step ``step`` (0-based) and return its metrics."""
        ...

    def save_files(self, directory: Path) -> None:
        """Write the model/optimizer files of a checkpoint into ``directory``."""
        ...

    def load_files(self, directory: Path) -> None:
        """Restore what :meth:`save_files` wrote."""
        ...

    def state(self) -> Mapping[str, Any]:
        """JSON-able state besides models (data position, scheduler state), saved in every checkpoint."""
        ...

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state` returned."""
        ...

    def phases(self) -> Phases:
        """The optional phases this recipe has; read once, when the run is built."""
        ...


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


class PipelineBuild(Protocol):
    """``build(config) -> Pipeline`` of a ``roll.pipeline`` plugin.

    ``config`` is an instance of the spec's ``config_model`` (a :class:`RunConfig` subclass), validated, frozen and
    pre-flighted. ``build`` runs in the driver process of ``roll train`` after the config is loaded and before
    anything else: it may start Ray and actors (or leave that to ``run``) and returns an object with ``run()`` (train
    to the end, return a summary mapping) and ``shutdown()`` (free every actor; called by the CLI also after a
    failure). Raise a :class:`roll.core.errors.RollError` for a setup the config could not reject."""

    def __call__(self, config: Any, /) -> Pipeline: ...


class StrategyBuild(Protocol):
    """``build(config, model, **kwargs)`` of a ``roll.strategy`` plugin.

    Runs inside a worker actor (a Ray process) once per role and rank. ``config`` is an instance of the spec's
    ``config_model`` with the run's micro-batch sizes filled in, ``model`` the role's model section (path, dtype,
    seed). ``kwargs`` are role-specific and may grow: an infer strategy gets ``tokenizer`` and ``eos_token_ids``,
    a train strategy ``total_steps``; accept ``**kwargs``. Returns an object implementing
    ``roll.workers.types.TrainStrategy`` (kind ``train``) or ``InferStrategy`` (kind ``infer``); the role checks
    the members and names the missing ones. Name the first two parameters ``config`` and ``model`` (extra keywords
    arrive beside them, so they are not positional-only). Heavy imports (torch, vLLM, Megatron) belong here, not in the spec's
    module."""

    def __call__(self, config: Any, model: Any, **kwargs: Any) -> Any: ...


class RewardBuild(Protocol):
    """``build(config)`` of a ``roll.reward`` (or ``roll.diffusion_reward``) plugin.

    ``config`` is the domain's ``options`` validated by the spec's ``config_model`` (``None`` when the spec has
    none). Runs once per reward worker (a Ray actor) and returns the scorer: for ``roll.reward``, an object with
    ``score(requests: list[RewardRequest]) -> list[RewardResult]`` (``roll.pipelines.rewards.types.RewardFunction``),
    one result per request, in order. A bad response is a result (``RewardResult.failed``), never an exception; an
    exception from ``score`` leaves the batch unscored, shows its traceback once and counts toward
    ``failures.max_error_rate``. Each ``score`` call runs under the domain's call deadline
    (``rewards.<domain>.workers.call_timeout_s``, else ``ray.call_timeout_s``): past it the worker is restarted
    and its rows count as unscored."""

    def __call__(self, config: Any, /) -> Any: ...


class EnvBuild(Protocol):
    """``build(config)`` of a ``roll.env`` plugin.

    ``config`` is the env entry's ``options`` validated by the spec's ``config_model`` (a subclass of
    ``roll.agentic.types.EnvConfig``, its ``type`` filled in), or ``None`` when the spec has none. Called once per
    env slot inside an env worker (a Ray actor); returns a fresh ``roll.agentic.types.Env`` (max_steps,
    system_prompt, action_space_text, reset, step, render, close), which the env manager owns alone (no thread
    safety needed). Every call into it runs under ``env_manager.step_timeout_s``; an exception ends that episode,
    shows its traceback once and counts toward ``failures.max_error_rate``."""

    def __call__(self, config: Any, /) -> Any: ...


class ToolBuild(Protocol):
    """``build(config)`` of a ``roll.tool`` plugin.

    ``config`` is the tool entry's ``options`` validated by the spec's ``config_model`` (``None`` when the spec has
    none). Returns one ``roll.agentic.types.Tool`` or a sequence of them (an MCP server offers several); each is
    checked against the protocol. A tool's ``call`` reports failures as ``ToolResult(text, ok=False)`` for the model
    to read, never as exceptions; it runs inside the env step, so under the env's deadline."""

    def __call__(self, config: Any, /) -> Any: ...


class ToolParserBuild(Protocol):
    """``build(tools) -> parser`` of a ``roll.tool_parser`` plugin.

    ``tools`` are the schemas of the tools the model may call, in the OpenAI function format
    (``{"type": "function", "function": {"name", "description", "parameters"}}``), or ``None`` when they are not
    known (then any function name is accepted and values are read without their types). Returns a
    ``roll.agentic.types.ToolParser``: ``tools_prompt(note)`` (the system-prompt section the format's chat template
    writes), ``render(calls)`` (calls as the template writes an assistant turn), ``parse(text)`` (the calls in a
    model's output, each well formed or a ``ToolCallError`` whose message the model reads as the tool's answer;
    it never raises for bad model output) and ``render_responses(responses)``. Called once per env slot that has
    tools (inside an env worker) and per request in a gateway; keep it cheap and free of I/O."""

    def __call__(self, tools: Sequence[Mapping[str, Any]] | None, /) -> Any: ...


class AgentBuild(Protocol):
    """``build(config)`` of a ``roll.agent`` plugin.

    ``config`` is the agent's ``options`` validated by the spec's ``config_model`` (``None`` when it has none).
    Returns a callable ``agent(base_url, api_key, task) -> reward``: it plays one episode of the task row
    ``task`` (a dict) with any OpenAI-compatible client pointed at ``base_url`` with ``api_key``, and returns a
    finite number (or ``{"reward": number}``). It runs in a thread of the rollout worker, many at once, under
    ``gateway.episode_timeout_s``; an exception ends the episode, shows its traceback once and counts toward
    ``failures.max_error_rate`` (see ``roll.agentic.gateway``)."""

    def __call__(self, config: Any, /) -> Any: ...


class TrackerBuild(Protocol):
    """``build(output_dir, tracking, run_config) -> Tracker`` of a ``roll.tracker`` plugin.

    Called in the driver when the run starts, once per name in ``tracking.backends``: ``output_dir`` is the run's
    folder (write files under it), ``tracking`` the run's ``tracking`` section, ``run_config`` the whole config as
    plain JSON data (or ``None``). The tracker's ``log(metrics, step)`` gets flat ``{"group/name": float}`` dicts every
    ``tracking.log_every`` steps; ``close()`` runs at the end, also after a failure. Optional members the
    pipeline uses when present: ``log_images(images, step)`` (``{name: png path}``), ``log_samples(rows, step, kind)``
    (see :mod:`roll.core.samples`) and ``rewind(last_step)`` (a
    restart from a checkpoint continues after ``last_step``: drop what was logged past it). An exception from
    ``log`` stops the run non-zero with its traceback."""

    def __call__(
        self, output_dir: Path, tracking: TrackingConfig, run_config: Mapping[str, Any] | None, /
    ) -> Tracker: ...


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
    build: PipelineBuild
    description: str = ""
    preflight: Callable[[Any], Sequence[ConfigIssue]] | None = None
    explain: Callable[[Any], Sequence[str]] | None = None
    export: ExportHook | None = None


@dataclass(frozen=True)
class StrategySpec:
    """A train or infer backend: ``type: <name>`` in a role's ``strategy`` section picks it."""

    name: str
    kind: Literal["train", "infer"]
    config_model: type[Any]
    build: StrategyBuild
    description: str = ""
    extra: str | None = None  # the pip extra that provides its backend, e.g. "vllm"


@dataclass(frozen=True)
class RewardSpec:
    """A reward: ``type: <name>`` in a ``rewards`` domain picks it; ``options`` validate against ``config_model``."""

    name: str
    build: RewardBuild
    config_model: type[Any] | None = None
    description: str = ""


@dataclass(frozen=True)
class EnvSpec:
    """An environment: ``type: <name>`` in ``env_manager.envs`` picks it; ``options`` validate against ``config_model``."""

    name: str
    build: EnvBuild
    config_model: type[Any] | None = None
    description: str = ""


@dataclass(frozen=True)
class ToolSpec:
    """A tool: ``type: <name>`` in an env entry's ``tools`` picks it; ``options`` validate against ``config_model``."""

    name: str
    build: ToolBuild
    config_model: type[Any] | None = None
    description: str = ""


@dataclass(frozen=True)
class ToolParserSpec:
    """A tool-call format: ``tool_calls.format: <name>`` on an env entry (or a gateway's option) picks it."""

    name: str
    build: ToolParserBuild
    description: str = ""


@dataclass(frozen=True)
class AgentSpec:
    """Agent code: ``agent: {type: <name>}`` picks it; ``options`` validate against ``config_model``."""

    name: str
    build: AgentBuild
    config_model: type[Any] | None = None
    description: str = ""


@dataclass(frozen=True)
class TrackerSpec:
    """A metrics sink: a name in ``tracking.backends`` picks it."""

    name: str
    build: TrackerBuild
    description: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)


GROUPS: dict[str, type[Any]] = {
    "roll.pipeline": PipelineSpec,
    "roll.strategy": StrategySpec,
    "roll.reward": RewardSpec,
    "roll.diffusion_reward": RewardSpec,
    "roll.env": EnvSpec,
    "roll.tool": ToolSpec,
    "roll.tool_parser": ToolParserSpec,
    "roll.agent": AgentSpec,
    "roll.tracker": TrackerSpec,
}
"""Every entry-point group and the spec type its objects must be."""
