"""The KubeRay ``RayJob`` manifest in docs/cluster.md: valid YAML of kind RayJob whose head and worker groups
offer the labels its entrypoint pins roles to, and whose entrypoint is a ``roll train`` command that validates."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from roll.core.cli import load_run_config

ROOT = Path(__file__).resolve().parents[2]


def test_rayjob_manifest_in_docs() -> None:
    text = (ROOT / "docs" / "cluster.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```kubernetes\n(.*?)```", text, flags=re.S)
    job = yaml.safe_load(block)
    assert job["kind"] == "RayJob" and job["apiVersion"] == "ray.io/v1"
    cluster = job["spec"]["rayClusterSpec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    labels = {k for g in groups for k in yaml.safe_load(yaml.safe_load(g["rayStartParams"]["resources"]))}
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["roll", "train"]
    _, cfg = load_run_config(ROOT / argv[2], argv[3:])
    pinned = {cfg.actor_train.node, cfg.actor_infer.node, cfg.rewards["arithmetic"].workers.node}
    assert pinned == labels == {"trainer", "rollout"}
