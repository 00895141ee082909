"""The quickstart on two Ray nodes: ``examples/quickstart.yaml`` as it is, plus node pins and a short run.

``ray.cluster_utils.Cluster`` starts two Ray nodes on this machine, labelled ``trainer_node`` and
``rollout_node`` (what ``ray start --resources='{"trainer_node": 1}'`` does on real hosts). The run attaches
through ``RAY_ADDRESS`` like a job on a real cluster, pins ``actor_train`` to one node and ``actor_infer`` and the
reward workers to the other with the roles' ``node`` keys, trains 2 warm-up and 2 GRPO steps of 4 prompts, and
reports the node of every actor. A multi-node Ray cannot share the session's local Ray, so it runs in a
subprocess. The weights cross nodes by the collective (gloo) path: the roles share no node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SCRIPT = r"""
import json, os, sys
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # cluster_utils starts nodes without a token
import ray
from ray.cluster_utils import Cluster as RayCluster
from roll.core.cli import load_run_config

nodes = RayCluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"trainer_node": 1}})
nodes.add_node(num_cpus=2, resources={"rollout_node": 1})
nodes.wait_for_nodes()
os.environ["RAY_ADDRESS"] = nodes.address
pipeline = None
try:
    spec, cfg = load_run_config(__import__("pathlib").Path(sys.argv[1]), sys.argv[2:])
    pipeline = spec.build(cfg)
    metrics = pipeline.run()
    label_of = {n["NodeID"]: label for n in ray.nodes() if n["Alive"]
                for label in ("trainer_node", "rollout_node") if label in n["Resources"]}
    placed = {c.role: sorted({label_of[i.node_id] for i in c.infos}) for c in pipeline.clusters}
    print("RESULT " + json.dumps({"placed": placed, "version": metrics.get("policy_version")}))
finally:
    if pipeline is not None:
        pipeline.shutdown()
    ray.shutdown()
    nodes.shutdown()
"""


@pytest.mark.slow
def test_quickstart_on_two_nodes(tmp_path: Path) -> None:
    script = tmp_path / "two_nodes.py"
    script.write_text(_SCRIPT)
    overrides = [
        f"output_dir={tmp_path / 'out'}", "max_steps=2", "eval_every=0", "warmup.steps=2", "warmup.batch_size=8",
        "batch.prompts_per_step=4", "batch.samples_per_prompt=4", "batch.micro_batch_samples=16",
        "rollout.request_prompts=4", "placement=separate",  # the generator is its own actor, on the other node
        "tracking.backends=[jsonl]", "actor_train.node=trainer_node", "actor_infer.node=rollout_node",
        "rewards.arithmetic.workers.node=rollout_node",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cmd = [sys.executable, str(script), str(ROOT / "examples" / "quickstart.yaml"), *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400, cwd=tmp_path)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["placed"]["actor_train"] == ["trainer_node"]
    assert result["placed"]["actor_infer"] == ["rollout_node"]
    assert result["placed"]["reward_arithmetic"] == ["rollout_node"]
    assert result["version"] == 3.0  # one sync after the warm-up, one per GRPO step
