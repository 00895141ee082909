"""What a process holds before it touches any data: resident memory and time of each import a roll process makes.

Each line runs in a fresh interpreter (``python -c``) and prints the peak RSS after the import, split into private
(anonymous) and file-backed pages, and the import's wall time. File-backed pages are shared between processes in
physical memory but counted by every process in a summed RSS (see ``bench_memory.py``'s PSS row). The torch line
says which wheel is installed: PyPI's Linux wheel is the CUDA build, which maps the CUDA libraries even on a
CPU-only machine.

    uv run python benchmarks/bench_import_memory.py [--python OTHER_INTERPRETER]

``--python`` measures another environment's interpreter (for example one with the ``+cpu`` torch wheel) on the
imports it has.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

IMPORTS = {
    "bare interpreter": "pass",
    "ray": "import ray",
    "datasets": "import datasets",
    "torch": "import torch",
    "torch + a transformers model class": "import torch; from transformers import Qwen2ForCausalLM",
    "roll reward worker module": "import roll.pipelines.rlvr.reward_worker",
    "roll actor worker module": "import roll.workers.roles.actor",
    "roll rlvr pipeline module (the driver)": "import roll.pipelines.rlvr.pipeline",
}

PROBE = """
import time
t = time.perf_counter()
{code}
took = time.perf_counter() - t
status = open("/proc/self/status").read().split("\\n")
kib = {{line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith(("VmHWM", "RssAnon", "RssFile"))}}
import sys
extra = getattr(sys.modules.get("torch"), "__version__", "")
print(kib["VmHWM"] // 1024, kib["RssAnon"] // 1024, kib["RssFile"] // 1024, f"{{took:.1f}}", extra)
"""


def measure(python: str, code: str) -> list[str] | None:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    out = subprocess.run([python, "-c", PROBE.format(code=code)], capture_output=True, text=True, env=env)
    return out.stdout.split() if out.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter to measure")
    args = parser.parse_args()
    print(f"load (1 min) at start: {os.getloadavg()[0]:.2f}; interpreter: {args.python}")
    print("| import | peak RSS MiB | private MiB | file-backed MiB | s | torch |")
    print("|---|---|---|---|---|---|")
    for name, code in IMPORTS.items():
        row = measure(args.python, code)
        if row is None:
            print(f"| {name} | (not importable here) | | | | |")
            continue
        hwm, anon, file, took, *version = row
        print(f"| {name} | {hwm} | {anon} | {file} | {took} | {' '.join(version)} |")


if __name__ == "__main__":
    main()
