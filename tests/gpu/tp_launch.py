"""Run a test module's ``fn(tp)`` in ``tp`` processes (one per GPU, torchrun's environment) and return rank 0's
result: how the ``gpu`` tests compare tensor-parallel sizes. Not a test module (no ``test_`` prefix)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

_SCRIPT = r"""
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("tp_target", os.environ["ROLL_TP_FILE"])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
out = getattr(module, os.environ["ROLL_TP_FN"])(int(os.environ["ROLL_TP"]))
if int(os.environ["RANK"]) == 0:
    print("RESULT " + json.dumps(out))
"""


def launch(tp: int, tmp: Path, test_file: Path, fn: str, timeout_s: float = 300) -> dict[str, Any]:
    """``fn(tp)`` of ``test_file`` on ranks ``0..tp-1``; every rank must exit 0 (their output is in the error)."""
    script = tmp / "tp_run.py"
    script.write_text(_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(tp):
        env = {
            **os.environ, "RANK": str(rank), "WORLD_SIZE": str(tp), "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "ROLL_TP": str(tp),
            "ROLL_TP_FILE": str(test_file), "ROLL_TP_FN": fn,
        }  # fmt: skip
        procs.append(
            subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
        )
    outs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    line = next(ln for ln in outs[0].splitlines() if ln.startswith("RESULT "))
    return dict(json.loads(line.removeprefix("RESULT ")))
