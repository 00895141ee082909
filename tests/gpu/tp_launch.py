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


def assert_same_step(one: dict[str, Any], two: dict[str, Any], scores: str) -> None:
    """Two TP sizes' one-step results agree: ``scores`` (log-probs or values), loss, grad norm, every weight."""
    import pytest
    import torch

    torch.testing.assert_close(torch.tensor(two[scores]), torch.tensor(one[scores]), atol=1e-4, rtol=1e-4)
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-4)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-3)
    assert set(two["weights"]) == set(one["weights"])
    for name, total in one["weights"].items():
        assert two["weights"][name] == pytest.approx(total, rel=1e-4, abs=1e-3), name


def assert_tp2_matches_tp1(tmp: Path, test_file: Path, fn: str, scores: str) -> None:
    """``fn`` of ``test_file`` at TP=1 and TP=2 (:func:`launch`) gives the same step (:func:`assert_same_step`)."""
    assert_same_step(launch(1, tmp, test_file, fn), launch(2, tmp, test_file, fn), scores)
