"""The ``roll`` command: ``train``, ``eval``, ``validate`` (``--explain``), ``export`` and ``list``.

Entry points are short: parse, build, run, clean up. Every error roll raises on purpose (a :class:`RollError`)
is printed as its message, without a traceback, and the exit status says what kind it was: 0 done, 1 runtime
error, 2 config error, 75 preempted (SIGTERM/SIGINT: the step finished and a checkpoint was written; rerun with
``resume=auto``), 130 interrupted (a step abandoned; the last checkpoint kept).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from roll.core import plugins
from roll.core.config.loader import ConfigTree, load_tree, validate
from roll.core.config.reference import defaults_left
from roll.core.config.sections import RunConfig
from roll.core.errors import ConfigError, ConfigIssue, RollError
from roll.core.recovery import EXIT_PREEMPTED, Preempted
from roll.core.startup import startup_issues
from roll.core.types import GROUPS, PipelineSpec

EXIT_CONFIG = 2
EXIT_RUNTIME = 1
EXIT_INTERRUPTED = 130
"""A step was abandoned (a second SIGTERM/SIGINT, or one before training started); the last checkpoint is kept."""
# EXIT_PREEMPTED (75): stopped on SIGTERM/SIGINT after a finished step and a fresh checkpoint; rerun the same
# command with resume=auto to continue exactly. Defined in roll.core.recovery.
EVAL_PIPELINE = "rlvr_rollout"
"""What ``roll eval`` runs when the config names no pipeline (roll-pipelines' rollout-only evaluation)."""
NO_PREFLIGHT_HELP = (
    "skip the start-up checks (trackers, node pins, model paths, data sources, plugin options)"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"roll: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except RollError as exc:
        print(f"roll: error: {exc}", file=sys.stderr)
        return EXIT_RUNTIME


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="roll", description="Post-training for LLMs on Ray.")
    parser.add_argument("--version", action="version", version=f"roll-core {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run the pipeline a config names")
    train.add_argument("config", type=Path)
    train.add_argument(
        "overrides",
        nargs="*",
        help="dotted overrides, e.g. max_steps=10 actor_train.strategy.optimizer.lr=1e-5",
    )
    train.add_argument("--no-preflight", action="store_true", help=NO_PREFLIGHT_HELP)
    train.set_defaults(func=_cmd_train)
    evaluate = sub.add_parser(
        "eval", help=f"run an evaluation config (pipeline {EVAL_PIPELINE!r} unless the config names another)"
    )
    evaluate.add_argument("config", type=Path)
    evaluate.add_argument("overrides", nargs="*", help="dotted overrides, as for train")
    evaluate.add_argument("--no-preflight", action="store_true", help=NO_PREFLIGHT_HELP)
    evaluate.set_defaults(func=_cmd_eval)
    check = sub.add_parser("validate", help="check a config and report every problem at once")
    check.add_argument("config", type=Path)
    check.add_argument("overrides", nargs="*", help="dotted overrides, as for train")
    check.add_argument(
        "--explain",
        action="store_true",
        help="also print what presets set and every key the config leaves at its default, with its value",
    )
    check.add_argument("--no-preflight", action="store_true", help=NO_PREFLIGHT_HELP)
    check.set_defaults(func=_cmd_validate)
    _add_export(sub)
    listing = sub.add_parser("list", help="list installed plugins of every group")
    listing.set_defaults(func=_cmd_list)
    return parser


def _add_export(sub: Any) -> None:
    export = sub.add_parser(
        "export",
        help="write a checkpoint's model as a folder that transformers (or diffusers) loads without roll",
        description="Export the newest intact checkpoint of a run (or one checkpoint dir) as a save_pretrained "
        "folder: config, safetensors weights, tokenizer, generation config and chat template (a VLM's processor "
        "too; a diffusion run: a diffusers folder or LoRA weights). Sharded and LoRA weights come out full.",
    )
    export.add_argument(
        "source", type=Path, metavar="RUN_OR_CHECKPOINT", help="a run's output dir or one checkpoint"
    )
    export.add_argument(
        "out", type=Path, metavar="OUT", help="the folder to write (must not exist, or be empty)"
    )
    export.add_argument(
        "--role",
        default=None,
        help="which trained model (default: the mode's policy or main model; critic: PPO's value model)",
    )
    export.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT")
    export.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    from roll.core.export import describe, export

    result = export(args.source, args.out, role=args.role, overwrite=args.overwrite)
    print("\n".join(describe(result)))
    return 0


def _version() -> str:
    try:
        return version("roll-core")
    except PackageNotFoundError:
        return "unknown"


def load_run_config(
    path: Path, overrides: Sequence[str], *, preflight: bool = False
) -> tuple[PipelineSpec, RunConfig]:
    """Compose the YAML, pick the pipeline plugin its ``pipeline:`` key names, and validate against its model.

    With ``preflight``, every start-up check runs too (:func:`roll.core.startup.startup_issues`: trackers, node
    pins, then the pipeline's own :attr:`PipelineSpec.preflight` of data sources, model paths and plugin options),
    the same for ``roll validate`` and ``roll train``; their issues are located in the YAML like any other and
    raise one :class:`ConfigError`.
    """
    # Two passes: the first only reads which pipeline (and so which model) applies; the second lets overrides
    # set any key that model declares, even keys the YAML leaves to their defaults.
    picked = load_tree(path, [o for o in overrides if o.lstrip("+").startswith("pipeline=")])
    spec = _pipeline_spec(picked)
    tree = load_tree(path, overrides, model=spec.config_model)
    config = validate(tree, spec.config_model)
    if preflight:
        issues = [_located(issue, tree) for issue in startup_issues(spec, config)]
        if issues:
            raise ConfigError(issues=issues)
    return spec, config


def _located(issue: ConfigIssue, tree: ConfigTree) -> ConfigIssue:
    if issue.source is not None:
        return issue
    return ConfigIssue(issue.path, issue.message, issue.hint, tree.source(issue.path))


def _pipeline_spec(tree: ConfigTree) -> PipelineSpec:
    installed = sorted(plugins.available("roll.pipeline"))
    name = tree.data.get("pipeline")
    if not isinstance(name, str) or not name:
        hint = f"add `pipeline: <name>` with one of: {', '.join(installed) or '(none installed)'}"
        raise ConfigError(issues=[ConfigIssue("pipeline", "missing: the config must name a pipeline", hint)])
    if name not in installed:
        import difflib

        close = difflib.get_close_matches(name, installed, n=1)
        hint = (f"did you mean {close[0]!r}? " if close else "") + f"installed: {', '.join(installed)}"
        source = tree.sources.get("pipeline")
        raise ConfigError(
            issues=[ConfigIssue("pipeline", f"no pipeline plugin named {name!r}", hint, source)]
        )
    spec: PipelineSpec = plugins.load("roll.pipeline", name)
    return spec


def _cmd_validate(args: argparse.Namespace) -> int:
    spec, cfg = load_run_config(args.config, args.overrides, preflight=not args.no_preflight)
    print(f"{args.config}: ok (pipeline {spec.name!r}, {type(cfg).__name__})")
    if args.explain:
        print("\n".join(_explain(spec, cfg)))
    return 0


def _explain(spec: PipelineSpec, cfg: RunConfig) -> list[str]:
    """What the pipeline's presets set, then every key left at its default (``key: value``, in model order)."""
    lines = list(spec.explain(cfg)) if spec.explain is not None else []
    if not lines:
        lines = [f"pipeline {spec.name!r} has no presets: every key is the config's or its default"]
    left = list(defaults_left(cfg))
    lines.append(f"defaults: {len(left)} keys the config leaves unset")
    lines += [f"  {key}: {value}" for key, value in left]
    return lines


def _cmd_eval(args: argparse.Namespace) -> int:
    """``train`` for evaluation configs: the same run, with ``pipeline`` defaulting to :data:`EVAL_PIPELINE`."""
    if "pipeline" not in load_tree(args.config, []).data:
        args.overrides = [f"+pipeline={EVAL_PIPELINE}", *args.overrides]
    return _cmd_train(args)


def _cmd_train(args: argparse.Namespace) -> int:
    spec, cfg = load_run_config(args.config, args.overrides, preflight=not args.no_preflight)
    pipeline = spec.build(cfg)
    try:
        summary = pipeline.run()
    except Preempted as exc:
        print(f"roll: preempted: {exc}", file=sys.stderr)
        return EXIT_PREEMPTED
    except KeyboardInterrupt as exc:
        print(f"roll: interrupted ({exc}); shutting the actors down", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    finally:
        pipeline.shutdown()
    _print_summary(pipeline, summary)
    return 0


def _print_summary(pipeline: Any, summary: Any) -> None:
    """The pipeline's closing lines (:mod:`roll.core.summary`); a pipeline without them gets one short line."""
    if not summary:
        return
    lines = getattr(pipeline, "summary_lines", None)
    if lines is not None:
        print("\n".join(lines()))
        return
    items = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in list(summary.items())[:6]]
    print(f"roll: done: {', '.join(items)}")


def _cmd_list(args: argparse.Namespace) -> int:
    for group in GROUPS:
        print(f"{group}:")
        infos = plugins.available(group)
        if not infos:
            print("  (none)")
        for name, info in sorted(infos.items()):
            status = _load_status(group, name)
            print(f"  {name:<18} {info.dist:<18} {info.version:<10} {status}")
    return 0


def _load_status(group: str, name: str) -> str:
    try:
        plugins.load(group, name)
    except RollError as exc:
        return f"unavailable: {exc}"
    return "ok"


if __name__ == "__main__":
    raise SystemExit(main())
