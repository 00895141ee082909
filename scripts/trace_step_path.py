"""Print the call path of one training step: from ``roll train`` to the trainer's ``optimizer.step()``.

Runs ``roll train CONFIG`` for one step (no warm-up, no evaluation) with two probes:

- in this process (the driver), the stack at the first cluster call named ``train_step``;
- in every Ray worker, through a ``sitecustomize`` put on ``PYTHONPATH``, the stack at the first optimizer step
  (torch's global ``register_optimizer_step_pre_hook``).

It prints the roll frames of both stacks (Ray's and torch's own frames are counted, not listed), the roll modules
they cross and how often the path switches package. ``docs/architecture.md`` quotes its output for the GRPO
quickstart::

    uv run python scripts/trace_step_path.py examples/quickstart.yaml
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

SITECUSTOMIZE = """
import json, os, sys, traceback
if sys.argv and sys.argv[0].endswith("default_worker.py"):
    import torch.optim.optimizer as _opt

    def _probe(optimizer, args, kwargs):
        path = os.path.join(os.environ["ROLL_TRACE_DIR"], f"actor-{os.getpid()}.json")
        if not os.path.exists(path):
            frames = traceback.extract_stack()[:-1]
            with open(path, "w") as f:
                json.dump([[fr.filename, fr.lineno, fr.name] for fr in frames], f)

    _opt.register_optimizer_step_pre_hook(_probe)
"""


def roll_package(filename: str) -> str | None:
    """``core``, ``workers`` ... for a file of a roll package, None for any other file."""
    parts = Path(filename).parts
    for i in range(len(parts) - 2):
        if parts[i] == "roll" and parts[i + 1] in (
            "core",
            "data",
            "workers",
            "pipelines",
            "agentic",
            "diffusion",
        ):
            return parts[i + 1]
    return None


def module_of(filename: str) -> str:
    parts = Path(filename).with_suffix("").parts
    start = max(i for i, p in enumerate(parts) if p == "roll")
    return ".".join(parts[start:])


def report(title: str, frames: list[list[object]]) -> tuple[int, set[str], list[str]]:
    """Print the roll frames of ``frames`` (from the first roll frame on); returns (count, modules, packages)."""
    first = next(i for i, (f, _, _) in enumerate(frames) if roll_package(str(f)))
    kept = [(str(f), int(str(n)), str(name)) for f, n, name in frames[first:]]
    own = [fr for fr in kept if roll_package(fr[0])]
    print(
        f"\n{title}: {len(own)} roll frames ({len(kept) - len(own)} of other libraries between or after them)"
    )
    for filename, line, name in own:
        print(f"  {module_of(filename)}:{line}  {name}")
    return len(own), {module_of(f) for f, _, _ in own}, [str(roll_package(f)) for f, _, _ in own]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", type=Path)
    parser.add_argument("overrides", nargs="*", help="extra dotted overrides")
    args = parser.parse_args()

    from roll.core.cli import main as roll_main
    from roll.core.cluster.cluster import ClusterMethod

    trace_dir = Path(tempfile.mkdtemp(prefix="roll-trace-"))
    (trace_dir / "site").mkdir()
    (trace_dir / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    os.environ["ROLL_TRACE_DIR"] = str(trace_dir)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(trace_dir / "site"), os.environ.get("PYTHONPATH", "")])

    driver: list[list[object]] = []
    submit = ClusterMethod.submit

    def probed(self: ClusterMethod, *a: object, **kw: object) -> object:
        if self.name == "train_step" and not driver:
            driver.extend([fr.filename, fr.lineno, fr.name] for fr in traceback.extract_stack()[:-1])
        return submit(self, *a, **kw)

    ClusterMethod.submit = probed  # type: ignore[method-assign]
    overrides = ["max_steps=1", "eval_every=0", "warmup=null", "tracking.progress=false", "plot=false"]
    overrides += [f"output_dir={trace_dir / 'run'}", *args.overrides]
    code = roll_main(["train", str(args.config), *overrides])
    if code != 0 or not driver:
        print(f"roll train exited {code}; driver probe {'hit' if driver else 'missed'}", file=sys.stderr)
        return 1
    actors = sorted(trace_dir.glob("actor-*.json"))
    if not actors:
        print("no actor reached an optimizer step", file=sys.stderr)
        return 1
    n_driver, mods_driver, pkgs_driver = report("driver, roll train -> cluster.train_step", driver)
    n_actor, mods_actor, pkgs_actor = report(
        "actor, train_step -> optimizer.step", json.loads(actors[0].read_text())
    )
    packages = pkgs_driver + pkgs_actor
    switches = sum(a != b for a, b in itertools.pairwise(packages))
    print(
        f"\ntotal: {n_driver + n_actor} roll frames, {len(mods_driver | mods_actor)} roll modules, "
        f"{switches} package switches"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
