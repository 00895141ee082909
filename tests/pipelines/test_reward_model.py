"""The ``reward_model`` pipeline on the tiny model: pairwise accuracy rises, the export loads as a
sequence classifier, exact resume of a SIGKILLed ``roll train``, and the loss equals the Bradley-Terry formula by
hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core import columns as C
from roll.core.config.loader import load_config
from roll.pipelines.reward_model import RewardModelConfig

ROOT = Path(__file__).resolve().parents[2]
RM_YAML = ROOT / "examples" / "reward_model.yaml"
STEPS = 30
COMMON = [
    f"max_steps={STEPS}",
    "eval_every=10",
    "checkpoint.every_n_steps=10",
    "checkpoint.keep_last=3",
    "checkpoint.export_hf=true",
    "tracking.progress=false",
    "tracking.backends=[jsonl]",
    "tracking.log_samples_count=100000",  # every held-out pair
    "actor_train.cpus_per_worker=0.5",
    "actor_train.strategy.optimizer.lr=3e-3",
    "data.sources.0.max_samples=512",
]


def _config(out: Path, *overrides: str) -> RewardModelConfig:
    base = [f"output_dir={out}", "ray.num_cpus=null", *COMMON, *overrides]
    return load_config(RM_YAML, base, model=RewardModelConfig)


def _run(cfg: RewardModelConfig) -> None:
    from roll.pipelines.reward_model import SPEC

    pipeline = SPEC.build(cfg)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()


def _metrics(out: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["metrics"] for row in rows}


@pytest.fixture(scope="module")
def trained(ray_local: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rm") / "run"
    _run(_config(out))
    return out


@pytest.mark.slow
def test_pairwise_accuracy_is_above_chance(trained: Path) -> None:
    metrics = _metrics(trained)
    assert metrics[STEPS]["eval/pairwise_accuracy"] > 0.55  # held-out pairs, random-init 1M backbone
    assert metrics[STEPS]["eval/margin"] > 0


@pytest.mark.slow
def test_each_evaluation_logs_its_pairs_with_their_scores(trained: Path) -> None:
    """samples.jsonl holds every held-out pair of each evaluation with both scores; the share where the chosen
    response scores higher is the step's ``eval/pairwise_accuracy``."""
    from roll.core.samples import read_samples

    rows, metrics = read_samples(trained / "samples.jsonl"), _metrics(trained)
    assert sorted({r["step"] for r in rows}) == [10, 20, 30]
    for step in (10, 30):
        mine = [r for r in rows if r["step"] == step]
        assert all(r["correct"] == float(r["chosen_score"] > r["rejected_score"]) for r in mine)
        assert sum(r["correct"] for r in mine) / len(mine) == pytest.approx(
            metrics[step]["eval/pairwise_accuracy"]
        )


@pytest.mark.slow
def test_export_loads_as_a_sequence_classifier_and_every_parameter_changed(trained: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from roll.data.tiny import tiny_model_path

    model = AutoModelForSequenceClassification.from_pretrained(trained / "hf")
    backbone = dict(AutoModelForCausalLM.from_pretrained(tiny_model_path("tiny-1m")).model.named_parameters())
    for name, param in model.model.named_parameters():
        assert not torch.equal(param, backbone[name]), f"{name} did not change"
    ids = torch.tensor([[5, 6, 7, 8]])
    assert model(input_ids=ids).logits.shape == (1, 1)


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_metrics(trained: Path, tmp_path: Path, kill_and_resume: Any) -> None:
    """SIGKILL a real `roll train` after its first checkpoint; `resume=auto` then matches the uninterrupted run
    step for step, bitwise."""
    assert kill_and_resume(RM_YAML, COMMON, _metrics(trained), tmp_path) < STEPS


def test_loss_equals_bradley_terry_by_hand() -> None:
    """Scores (chosen, rejected) = (2, 1) and (0, 3): loss = (log(1 + e^-1) + log(1 + e^3)) / 2."""
    from roll.pipelines.reward_model.losses import BradleyTerryLoss
    from roll.workers.types import ForwardOutput

    loss_fn = BradleyTerryLoss()
    batch = {C.INPUT_IDS: torch.zeros(4, 3, dtype=torch.long)}
    out = ForwardOutput(logp_BT=torch.zeros(4, 0), scores_B=torch.tensor([2.0, 1.0, 0.0, 3.0]))
    mean = float(loss_fn(out, batch)[0]) / loss_fn.count_units(batch)
    assert mean == pytest.approx((math.log1p(math.exp(-1)) + math.log1p(math.exp(3))) / 2)
