"""Two Ray nodes (``ray.cluster_utils.Cluster``), one role pinned to each, checked by the workers' node IDs.

A multi-node Ray cannot share the session's local Ray, so the scenario runs as a script in a subprocess and
reports JSON. Both "nodes" live on this machine; each gets its own custom resource label to pin roles by.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_SCRIPT = r"""
import json, os
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # cluster_utils starts nodes without a token
import ray
from ray.cluster_utils import Cluster as RayCluster
from roll.core.cluster import Cluster, ResourceManager, Worker, init_ray, shutdown_ray
from roll.core.config.sections import RayConfig, RoleConfig


class Probe(Worker):
    pass


nodes = RayCluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}})
nodes.add_node(num_cpus=1, resources={"node_b": 1})
nodes.wait_for_nodes()
try:
    init_ray(RayConfig(address=nodes.address, init_timeout_s=30))
    label_to_node = {
        label: n["NodeID"] for n in ray.nodes() if n["Alive"] for label in ("node_a", "node_b") if label in n["Resources"]
    }
    roles = {"learner": RoleConfig(cpus_per_worker=0.5), "sampler": RoleConfig(cpus_per_worker=0.5)}
    with ResourceManager(roles, node_resource={"learner": "node_a", "sampler": "node_b"}, timeout_s=30) as rm:
        with Cluster("learner", Probe, roles["learner"], rm) as a, Cluster("sampler", Probe, roles["sampler"], rm) as b:
            out = {"expected": label_to_node, "learner": a.get_info()[0].node_id, "sampler": b.get_info()[0].node_id}
    print("RESULT " + json.dumps(out))
finally:
    shutdown_ray()
    nodes.shutdown()
"""


@pytest.mark.slow
def test_roles_pinned_to_two_nodes(tmp_path: Path) -> None:
    script = tmp_path / "two_nodes.py"
    script.write_text(_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"script failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1].removeprefix("RESULT "))
    expected = result["expected"]
    assert expected["node_a"] != expected["node_b"]
    assert result["learner"] == expected["node_a"]
    assert result["sampler"] == expected["node_b"]
