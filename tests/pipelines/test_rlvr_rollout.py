"""The ``rlvr_rollout`` evaluation pipeline: pass@k and the summary by hand, then a real run (Ray, tiny-1m, a
python reward) whose summary must agree with its own ``samples.jsonl``.

The run shares the session Ray; about 30 s on a quiet 2-core box (one inference actor, one reward actor).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from roll.core.cli import load_run_config
from roll.core.errors import ConfigError
from roll.pipelines.rlvr_rollout.metrics import pass_at_k, summarize

ROOT = Path(__file__).resolve().parents[2]


def test_pass_at_k_by_hand() -> None:
    """n=4, c=1: pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6, pass@4 = 1; c=0 gives 0."""
    assert [pass_at_k(4, 1, k) for k in (1, 2, 4)] == [0.25, 0.5, 1.0]
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(3, 3, 1) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_summary_overall_and_per_domain() -> None:
    """Prompt a (math): 1 of 2 correct; prompt b (code): 2 of 2; accuracy 3/4, pass@1 (0.5 + 1) / 2."""
    s = summarize([[True, False], [True, True]], [[1, 0], [1, 1]], [[2, 4], [6, 8]], ["math", "code"], [1, 2])
    assert s["accuracy"] == 0.75 and s["pass@1"] == 0.75 and s["pass@2"] == 1.0 and s["length_mean"] == 5.0
    assert s["math/accuracy"] == 0.5 and s["code/pass@1"] == 1.0 and s["math/prompts"] == 1.0


def test_config_rejects_k_above_samples_and_greedy_samples(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_run_config(ROOT / "examples" / "rlvr_rollout.yaml", ["pass_k=[1,8]", "rollout.temperature=0"])
    paths = {i.path for i in err.value.issues}
    assert paths == {"pass_k", "rollout.temperature"}


@pytest.mark.slow
def test_eval_run_writes_samples_and_a_consistent_summary(ray_local: Any, tmp_path: Path) -> None:
    (tmp_path / "parity.py").write_text(
        "def even(response, ground_truth, **kw):\n    return len(response) % 2 == 0\n"
    )
    data = yaml.safe_load((ROOT / "examples" / "rlvr_rollout.yaml").read_text())
    data["rewards"] = {
        "parity": {
            "type": "python",
            "tags": ["arithmetic"],
            "options": {"function": f"{tmp_path}/parity.py:even"},
            "workers": {"num_workers": 1, "cpus_per_worker": 0.25},
        }
    }
    cfg_path = tmp_path / "eval.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    overrides = [f"output_dir={tmp_path}/out", "ray.address=auto", "ray.num_cpus=null", "max_prompts=6",
                 "batch.samples_per_prompt=3", "pass_k=[1,3]", "tracking.progress=false", "actor_infer.cpus_per_worker=0.5"]  # fmt: skip
    spec, config = load_run_config(cfg_path, overrides, preflight=True)
    pipeline = spec.build(config)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert len(rows) == 18 and [r["sample"] for r in rows[:3]] == [0, 1, 2]
    assert all(r["correct"] == (len(r["response"]) % 2 == 0) for r in rows)  # the python reward, per answer
    by_prompt = [[r["correct"] for r in rows[i : i + 3]] for i in range(0, 18, 3)]
    assert summary["accuracy"] == pytest.approx(sum(map(sum, by_prompt)) / 18)
    assert summary["pass@3"] == pytest.approx(sum(any(p) for p in by_prompt) / 6)
    assert summary["parity/prompts"] == 6.0 and summary["pass@1"] <= summary["pass@3"]
    assert summary["length_mean"] == pytest.approx(sum(r["length"] for r in rows) / 18)
