"""The ``dpo`` pipeline on the tiny model: reward accuracy rises (held out and per train step), exact resume of a
SIGKILLed ``roll train``, the reference worker agrees with precomputed reference log-probs, the loss equals the
published formulas, bad pairs are skipped.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from roll.core.config.loader import load_config
from roll.core.errors import ConfigError
from roll.pipelines.dpo import DPOConfig

ROOT = Path(__file__).resolve().parents[2]
DPO_YAML = ROOT / "examples" / "dpo.yaml"
STEPS = 30
COMMON = [
    f"max_steps={STEPS}",
    "eval_every=10",
    "checkpoint.every_n_steps=10",
    "checkpoint.keep_last=3",
    "checkpoint.export_hf=true",
    "tracking.progress=false",
    "tracking.backends=[jsonl]",
    "actor_train.cpus_per_worker=0.5",
    "data.sources.0.max_samples=512",
]


def _config(out: Path, *overrides: str) -> DPOConfig:
    return load_config(
        DPO_YAML, [f"output_dir={out}", "ray.num_cpus=null", *COMMON, *overrides], model=DPOConfig
    )


def _run(cfg: DPOConfig) -> None:
    from roll.pipelines.dpo import SPEC

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
    out = tmp_path_factory.mktemp("dpo") / "run"
    _run(_config(out))
    return out


@pytest.mark.slow
def test_reward_accuracy_rises_above_chance_and_every_parameter_changed(trained: Path) -> None:
    from safetensors.torch import load_file

    from roll.data.tiny import tiny_model_path

    metrics = _metrics(trained)
    # Held-out pairs from a random-init 1M model: accuracy is modest (~0.6) but above chance, and the
    # margin between chosen and rejected implicit rewards grows as training goes on.
    assert metrics[STEPS]["eval/reward_accuracy"] > 0.55
    assert metrics[STEPS]["eval/reward_margin"] > metrics[10]["eval/reward_margin"] > 0
    assert metrics[STEPS]["eval/loss"] < math.log(2)
    assert metrics[1]["train/loss"] == pytest.approx(math.log(2), abs=1e-6)  # policy == reference at step 1
    before = load_file(tiny_model_path("tiny-1m") / "model.safetensors")
    after = load_file(trained / "hf" / "model.safetensors")
    for name, tensor in before.items():
        assert not torch.equal(tensor, after[name]), f"{name} did not change"


@pytest.mark.slow
def test_each_evaluation_logs_pairs_with_their_implicit_rewards(trained: Path) -> None:
    """samples.jsonl: 4 held-out pairs per evaluation (steps 10, 20, 30): prompt, both responses, their implicit
    rewards, ``correct`` where the chosen one's is higher."""
    from roll.core.samples import read_samples

    rows = read_samples(trained / "samples.jsonl")
    assert sorted({r["step"] for r in rows}) == [10, 20, 30] and len(rows) == 12
    for r in rows:
        assert r["kind"] == "eval" and r["prompt"] and r["chosen"] != r["rejected"]
        assert r["correct"] == float(r["chosen_implicit_reward"] > r["rejected_implicit_reward"])


@pytest.mark.slow
def test_train_steps_report_reward_accuracy_and_margin(trained: Path) -> None:
    """Each step logs the reward accuracy and margin of its own 32 pairs (before its update). At step 1 the policy
    is the reference, so every implicit reward is 0 up to float rounding: the reference's log-probs come from the
    plain forward and the policy's from the pair forward (``pair_prefix``: the same function, rounded differently,
    ~1e-7), so the rewards and margin are checked to 1e-5 and the step-1 accuracy, which compares those roundings
    (a tie counts as not accurate), is not. Later batches are noisy (32 pairs; measured 0.38-0.63 over steps
    11-30), so the check is on their mean."""
    metrics = _metrics(trained)
    names = ("train/reward_accuracy", "train/reward_margin", "train/chosen_reward", "train/rejected_reward")
    assert all(name in metrics[step] for step in metrics for name in names)
    for name in names[1:]:
        assert metrics[1][name] == pytest.approx(0.0, abs=1e-5)
    for m in metrics.values():  # the margin is the mean difference of the mean rewards, pair-weighted
        gap = m["train/chosen_reward"] - m["train/rejected_reward"]
        assert m["train/reward_margin"] == pytest.approx(gap, abs=1e-6)
    later = [metrics[step] for step in range(11, STEPS + 1)]
    assert sum(m["train/reward_accuracy"] for m in later) / len(later) > 0.5
    assert sum(m["train/reward_margin"] for m in later) / len(later) > 0.02


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_metrics(trained: Path, tmp_path: Path, kill_and_resume: Any) -> None:
    """SIGKILL a real `roll train` after its first checkpoint (with the precomputed reference log-probs in it);
    `resume=auto` then matches the uninterrupted run step for step, bitwise."""
    assert kill_and_resume(DPO_YAML, COMMON, _metrics(trained), tmp_path) < STEPS


@pytest.mark.slow
def test_reference_worker_agrees_with_precomputed_reference(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "worker"
    _run(_config(out, "max_steps=2", "eval_every=0", "reference.mode=worker", "checkpoint.export_hf=false"))
    # The LR schedule is constant, so step 2 of a 2-step run equals step 2 of the 30-step run.
    got, expected = _metrics(out)[2]["train/loss"], _metrics(trained)[2]["train/loss"]
    assert got == pytest.approx(expected, rel=1e-4)


# ------------------------------------------------------------------------------------------- no Ray needed


def _forward(logp_B: list[float], lengths: list[int]) -> tuple[Any, dict[str, torch.Tensor]]:
    """A ForwardOutput whose rows' response log-probs sum to ``logp_B`` (spread over ``lengths`` tokens)."""
    from roll.core.columns import LABELS, REF_SEQ_LOGP
    from roll.workers.types import ForwardOutput

    T = max(lengths) + 1
    logp_BT = torch.zeros(len(logp_B), T)
    labels_BT = torch.full((len(logp_B), T), -100)
    for b, (total, n) in enumerate(zip(logp_B, lengths)):
        logp_BT[b, 1 : n + 1] = total / n
        labels_BT[b, 1 : n + 1] = 5
    return ForwardOutput(logp_BT=logp_BT), {LABELS: labels_BT, REF_SEQ_LOGP: torch.zeros(len(logp_B))}


def test_losses_equal_the_published_formulas_by_hand() -> None:
    """Two pairs, policy log-probs (c, r) = (-4, -6) and (-5, -3), reference (-5, -5) and (-4, -4), beta 0.5.

    Log-ratio gaps h = (c - ref_c) - (r - ref_r): pair 1: (1) - (-1) = 2; pair 2: (-1) - (1) = -2.
    DPO: mean of -log sigmoid(beta h) = (softplus(-1) + softplus(1)) / 2. cDPO with eps = 0.2 adds
    eps * (log sigmoid(beta h) - log sigmoid(-beta h)) per pair, which cancels over these symmetric pairs.
    IPO (per-token mean log-probs, responses of 2 tokens: h halves to 1 and -1): mean of (h - 1/(2 beta))^2 =
    ((1 - 1)^2 + (-1 - 1)^2) / 2 = 2.
    """
    from roll.core.columns import REF_SEQ_LOGP
    from roll.pipelines.dpo.losses import DPOLoss

    output, batch = _forward([-4.0, -6.0, -5.0, -3.0], [2, 2, 2, 2])
    batch[REF_SEQ_LOGP] = torch.tensor([-5.0, -5.0, -4.0, -4.0])

    def mean_loss(fn: DPOLoss) -> float:
        return float(fn(output, batch)[0]) / fn.count_units(batch)

    def softplus(x: float) -> float:
        return math.log1p(math.exp(x))

    assert mean_loss(DPOLoss(beta=0.5)) == pytest.approx((softplus(-1) + softplus(1)) / 2)
    cdpo = ((0.8 * softplus(-1) + 0.2 * softplus(1)) + (0.8 * softplus(1) + 0.2 * softplus(-1))) / 2
    assert mean_loss(DPOLoss(beta=0.5, label_smoothing=0.2)) == pytest.approx(cdpo)
    assert mean_loss(DPOLoss("ipo", beta=0.5, average_logp=True)) == pytest.approx(2.0)


def test_identical_pairs_are_counted_and_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from roll.data.config import DataConfig, TokenizeConfig
    from roll.data.tokenizer import build_tokenizer
    from roll.pipelines.common.data import prepare_data

    path = tmp_path / "pairs.jsonl"
    rows = [
        {"prompt": "1+1", "chosen": "2", "rejected": "3"},
        {"prompt": "2+2", "chosen": "4", "rejected": "4"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    data = DataConfig(sources=[{"path": str(path)}])
    with caplog.at_level(logging.WARNING):
        prepared = prepare_data(data, TokenizeConfig(), kind="preference", tokenizer=build_tokenizer())
    assert len(prepared.train) == 1 and prepared.skipped["identical_pairs"] == 1
    assert "chosen equals rejected" in caplog.text


def test_pair_batches_must_hold_whole_pairs() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            DPO_YAML,
            ["batch.micro_batch_samples=3", "loss.type=ipo", "loss.label_smoothing=0.1"],
            model=DPOConfig,
        )
    assert "batch.micro_batch_samples" in str(info.value) and "loss.label_smoothing" in str(info.value)


def test_the_reference_strategy_is_a_section_and_its_old_name_key_points_there(tmp_path: Path) -> None:
    """``reference.strategy`` is a strategy section (its ``type`` names the plugin, like every role's); the old
    ``reference.strategy_name`` is refused with the new path as the hint, written in YAML or as an override."""
    cfg = _config(tmp_path / "new", "reference.mode=worker", "reference.strategy.type=hf")
    assert cfg.reference.strategy.type == "hf"
    old = tmp_path / "old.yaml"
    data = yaml.safe_load(DPO_YAML.read_text())
    data["reference"]["strategy_name"] = "hf"
    old.write_text(yaml.safe_dump(data))
    for path, overrides in ((old, []), (DPO_YAML, ["reference.strategy_name=hf"])):
        with pytest.raises(ConfigError) as info:
            load_config(path, [f"output_dir={tmp_path / 'out'}", *overrides], model=DPOConfig)
        hints = [(i.path, i.hint) for i in info.value.issues]
        assert ("reference.strategy_name", "move it to reference.strategy.type") in hints, hints
