"""The documentation is checked like code: every YAML block validates, every ``roll`` command line parses and its
config validates with the overrides it passes, the configuration reference is what the config models say today,
and the 8-GPU recipe puts every role on GPUs.

YAML blocks (```` ```yaml ```` in README.md and docs/**/*.md) come in four kinds, told apart by their first line:

- ``--8<-- "examples/x.yaml"`` (an MkDocs snippet include): the included example validates;
- ``# over: examples/x.yaml``: a partial config laid over that example (as its ``defaults:``) validates;
- ``# fragment``: not a whole config (a section shown alone, a manifest); it must parse as YAML;
- anything else: a whole config that names its pipeline, validated through roll's loader.

Configs under ``examples/plugins/`` need their plugin installed; tests/test_plugin_examples.py validates them.

Command lines are ``roll validate|train|eval|export|list`` (after an optional ``uv run``) in ```` ```bash ````
blocks, in inline code of the docs, and in the ``# Run:``-style comments of examples/**/*.yaml. An ``export``
line must parse and export a run an example writes (its ``output_dir``, or a checkpoint under it); what it
writes is tests/pipelines/test_export.py's.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
import yaml

from roll.core.cli import _parser, load_run_config
from roll.core.config.reference import reference_pages, undescribed_keys
from roll.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))
SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$')
PLUGIN_EXAMPLES = "examples/plugins/"
"""Configs of the example plugin packages: they name plugins this environment does not have, so
tests/test_plugin_examples.py checks them (and the commands that run them) with the plugins installed."""


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _yaml_blocks() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for i, block in enumerate(re.findall(r"^```yaml\n(.*?)^```", text, flags=re.S | re.M)):
            found.append((f"{_rel(doc)}#{i}", block))
    return found


YAML_BLOCKS = _yaml_blocks()


def test_docs_have_yaml_blocks_of_every_kind() -> None:
    firsts = [block.split("\n", 1)[0] for _, block in YAML_BLOCKS]
    assert any(SNIPPET.match(f) for f in firsts), "no example included with --8<--: the pattern broke"
    assert any(f.startswith("# over: ") for f in firsts)
    assert any(f.startswith("pipeline: ") for f in firsts), "no whole config in the docs"
    assert len(YAML_BLOCKS) >= 20


@pytest.mark.parametrize("where,block", YAML_BLOCKS, ids=[w for w, _ in YAML_BLOCKS])
def test_yaml_block_validates(where: str, block: str, tmp_path: Path) -> None:
    first = block.split("\n", 1)[0].strip()
    if first == "# fragment":
        assert yaml.safe_load(block) is not None, f"{where}: an empty fragment"
        return
    if (m := SNIPPET.match(first)) is not None:
        path = ROOT / m.group(1)
        assert path.suffix == ".yaml" and path.exists(), (
            f"{where}: includes {m.group(1)}, which does not exist"
        )
        if m.group(1).startswith(PLUGIN_EXAMPLES):
            return  # needs its plugin installed: tests/test_plugin_examples.py validates it with the plugin
    elif first.startswith("# over: "):
        base = ROOT / first.removeprefix("# over: ").strip()
        assert base.exists(), f"{where}: laid over {base}, which does not exist"
        path = tmp_path / "snippet.yaml"
        path.write_text(f"defaults: [{base}]\n{block}", encoding="utf-8")
    else:
        path = tmp_path / "snippet.yaml"
        path.write_text(block, encoding="utf-8")
    spec, config = load_run_config(path, [])
    assert config.pipeline == spec.name


COMMAND = re.compile(
    r"(?:uv run )?\broll (?:validate|train|eval|export|list)\b(?:[^`\n#();|]*?)(?=\s{3,}|[`\n#();|]|$)"
)
OVERRIDE_HINT = re.compile(r"\(override anything: ([^)]*)\)")
"""An example header's ``Run: uv run roll train examples/x.yaml   (override anything: a=1 b=2)``: checked as
the command with those overrides."""


def _commands() -> list[tuple[str, str]]:
    found: dict[tuple[str, str], None] = {}
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        chunks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M) + re.findall(
            r"`([^`\n]+)`", text
        )
        for chunk in chunks:
            for line in chunk.splitlines():
                found.update(((_rel(doc), m.group(0).strip()), None) for m in COMMAND.finditer(line))
    for example in EXAMPLES:
        for line in example.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                continue
            for m in COMMAND.finditer(line):
                hint = OVERRIDE_HINT.search(line, m.end())
                command = m.group(0).strip() + (f" {hint.group(1)}" if hint else "")
                found[(_rel(example), command)] = None
    # a command named in prose (`roll validate --explain` says ...) is not a command line: no config file named
    return [
        (w, c)
        for w, c in found
        if c.split()[-1] == "list" or any(a.endswith(".yaml") or a.startswith("outputs/") for a in c.split())
    ]


COMMANDS = _commands()


def test_docs_show_commands() -> None:
    kinds = {shlex.split(cmd.removeprefix("uv run "))[1] for _, cmd in COMMANDS}
    assert {"validate", "train", "eval", "export", "list"} <= kinds
    assert any("grpo_qwen2.5_7b_8gpu.yaml" in cmd for _, cmd in COMMANDS)


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}:{c}" for w, c in COMMANDS])
def test_command_parses_and_its_config_validates(where: str, command: str) -> None:
    """The argv parses as the CLI would parse it; a config it names validates with the overrides it passes and
    passes every start-up check (:func:`roll.core.startup.startup_issues`), as ``roll train`` runs them before Ray
    starts, unless the line says ``--no-preflight``."""
    argv = shlex.split(command.removeprefix("uv run "))
    assert argv[0] == "roll", f"{where}: {command}"
    args = _parser().parse_args(argv[1:])
    if args.command == "list":
        return
    if args.command == "export":
        runs = [_output_dir(example) for example in EXAMPLES]
        source = str(args.source)
        assert any(r and (source == r or source.startswith(f"{r}/")) for r in runs), (
            f"{where}: {command}: {source} is no example's output_dir"
        )
        return
    assert (ROOT / args.config).exists(), f"{where}: {command}: no file {args.config}"
    if str(args.config).startswith(PLUGIN_EXAMPLES):
        return  # needs its plugin installed: tests/test_plugin_examples.py validates it with the plugin
    overrides = list(args.overrides)
    if args.command == "eval" and "pipeline" not in yaml.safe_load((ROOT / args.config).read_text()):
        overrides.insert(0, "+pipeline=rlvr_rollout")
    preflight = not args.no_preflight  # train and eval run the same start-up checks as validate
    if line_expects_exit_2(where, command):
        with pytest.raises(ConfigError):
            load_run_config(ROOT / args.config, overrides, preflight=preflight)
        return
    try:
        spec, config = load_run_config(ROOT / args.config, overrides, preflight=preflight)
    except ConfigError as exc:
        # A path an earlier documented run writes (outputs/...) does not exist in a fresh checkout: that, and
        # only that, may fail here.
        others = [i for i in exc.issues if not _names_a_run_output(i.message, overrides)]
        assert not others, f"{where}: {command}: {exc}"
        return
    assert config.pipeline == spec.name


def _names_a_run_output(message: str, overrides: list[str]) -> bool:
    outputs = [
        o.split("=", 1)[1] for o in overrides if "=" in o and o.split("=", 1)[1].startswith("outputs/")
    ]
    return any(f"{path!r} does not exist" in message for path in outputs)


def _output_dir(example: Path) -> str | None:
    data = yaml.safe_load(example.read_text(encoding="utf-8"))
    return str(data["output_dir"]) if isinstance(data, dict) and "output_dir" in data else None


def line_expects_exit_2(where: str, command: str) -> bool:
    """A docs line that shows a config error on purpose ends with ``# exits 2``."""
    text = (ROOT / where).read_text(encoding="utf-8")
    return any(command in line and line.rstrip().endswith("# exits 2") for line in text.splitlines())


HEADER_OVERRIDE = re.compile(
    r"(?<![\w./+~-])([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)+|[a-z_][a-z0-9_]*)=(\{[^}]*\}|\[[^\]]*\]|[^\s;,)`]+)"
)
"""A ``key=value`` override named in an example's header comment (``Variants: algorithm.k=null``), with a
``{...}`` or ``[...]`` value kept whole."""


def _header_overrides() -> list[tuple[str, str]]:
    found = []
    for example in EXAMPLES:
        for line in example.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break  # the header ends at the first line of YAML
            found += [(_rel(example), m.group(0)) for m in HEADER_OVERRIDE.finditer(line)]
    return found


HEADER_OVERRIDES = _header_overrides()


def test_example_headers_name_overrides() -> None:
    """The pattern finds the overrides the headers are known to show (a guard against a pattern that finds none)."""
    assert ("examples/quickstart.yaml", "rollout.temperature=0.8") in HEADER_OVERRIDES
    assert ("examples/reward_fl.yaml", "actor_train.strategy.lora={r: 4, alpha: 4}") in HEADER_OVERRIDES
    assert ("examples/rlvr_rollout.yaml", "actor_infer.model.path=outputs/quickstart-hf") in HEADER_OVERRIDES
    assert len(HEADER_OVERRIDES) >= 30


@pytest.mark.parametrize("where,override", HEADER_OVERRIDES, ids=[f"{w}:{o}" for w, o in HEADER_OVERRIDES])
def test_header_override_applies_to_its_example(where: str, override: str) -> None:
    """Every override an example's header suggests (``A real model: actor_train.model.path=...``) is a key of that
    example's config and passes the start-up checks with it, as ``roll train examples/x.yaml <override>`` would."""
    test_command_parses_and_its_config_validates(where, f"roll train {where} {shlex.quote(override)}")


def test_cli_help_examples_are_valid_overrides() -> None:
    """The overrides ``roll train --help`` (and every subcommand's help) shows as examples are keys of a real config."""
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    shown = [
        m.group(1)
        for name, command in sub.choices.items()
        for action in command._actions
        if (m := re.search(r"e\.g\. (.*)$", action.help or "")) is not None
    ]
    assert shown, "no example in the CLI help: the pattern broke"
    for overrides in shown:
        args = overrides.split()
        spec, config = load_run_config(ROOT / "examples/sft.yaml", args, preflight=True)
        assert config.pipeline == spec.name


# ------------------------------------------------------------------------------------------------ reference


def test_config_reference_is_current() -> None:
    """docs/reference/*.md equal what the config models render today (rerun scripts/gen_config_reference.py)."""
    pages = reference_pages()
    stale = [
        name
        for name, text in pages.items()
        if not (ROOT / "docs/reference" / name).exists()
        or (ROOT / "docs/reference" / name).read_text(encoding="utf-8") != text
    ]
    assert not stale, f"stale reference pages {stale}: run uv run python scripts/gen_config_reference.py"


def test_reference_lists_every_plugin_and_key() -> None:
    """Spot checks a reader relies on: a pipeline key, a strategy key, a reward option, an env option."""
    pages = reference_pages()
    assert "| `algorithm.preset` |" in pages["pipelines.md"] and "## `dpo`" in pages["pipelines.md"]
    assert "| `gpu_memory_utilization` | float (> 0.0, <= 1.0) | `0.5` |" in pages["strategies.md"]
    assert "## `exact_match`" in pages["rewards.md"] and "| `pattern` |" in pages["rewards.md"]
    assert "## `sokoban`" in pages["envs.md"] and "## `calculator`" in pages["tools.md"]
    assert (
        "| `qwen3_coder` |" in pages["tools.md"]
        and "| `env_manager.envs[].tool_calls.format` |" in pages["pipelines.md"]
    )
    assert "`trackio`" in pages["trackers.md"]
    assert "| `seed` | int | `42` |" in pages["run.md"]


def test_every_reference_key_has_a_description() -> None:
    """Every key of every installed config model says what it does: a new key needs ``Field(description=...)``
    (a section: its model's docstring). The row count guards against a page format this check no longer reads."""
    pages = reference_pages()
    rows = sum(line.startswith("| `") for text in pages.values() for line in text.splitlines())
    assert rows > 1000, f"only {rows} key rows found: did the table format change?"
    missing = [f"{name}: {key}" for name, text in pages.items() for key in undescribed_keys(text)]
    assert not missing, f"{len(missing)} keys without a description (add Field(description=...)): {missing}"


# ------------------------------------------------------------------------------------------------ recipes


def test_the_8_gpu_grpo_recipe_puts_every_role_on_gpus() -> None:
    path = ROOT / "examples/gpu/grpo_qwen2.5_7b_8gpu.yaml"
    _, config = load_run_config(path, [], preflight=True)
    roles = {name: getattr(config, name) for name in ("actor_train", "actor_infer", "reference")}
    assert all(r is not None and r.gpus_per_worker >= 1 for r in roles.values()), roles
    assert sum(r.num_workers * r.gpus_per_worker for r in roles.values()) == 3 * 8  # time-shared on 8 GPUs
    assert {r.device_group for r in roles.values()} == {"node0"}
    assert (
        config.actor_infer.strategy.type == "vllm"
        and config.actor_train.model.path == "Qwen/Qwen2.5-7B-Instruct"
    )
    assert config.algorithm.adv_estimator == "grpo" and config.algorithm.kl_mode == "loss"
