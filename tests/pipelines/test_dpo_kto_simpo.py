"""KTO and SimPO in the ``dpo`` pipeline: unpaired data, the loss objects by hand, config checks, and short runs
where the preference signal must be learnt (slow)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core.columns import DESIRABLE, LABELS, REF_SEQ_LOGP
from roll.core.config.loader import load_config
from roll.core.errors import ConfigError, DataError
from roll.pipelines.dpo import DPOConfig

ROOT = Path(__file__).resolve().parents[2]
DPO_YAML = ROOT / "examples" / "dpo.yaml"
KTO = ["loss.type=kto", "batch.samples_per_prompt=1", "batch.prompts_per_step=64"]


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _prepare(path: Path) -> Any:
    from roll.data.config import DataConfig, TokenizeConfig
    from roll.data.tokenizer import build_tokenizer
    from roll.pipelines.common.data import prepare_data

    data = DataConfig(sources=[{"path": str(path)}])
    return prepare_data(data, TokenizeConfig(), kind="unpaired", tokenizer=build_tokenizer())


def test_unpaired_rows_tokenize_into_a_kto_batch(tmp_path: Path) -> None:
    """(prompt, completion, label) rows keep their label; the batch trains the completion tokens only, and the
    mismatched batch puts row i-1's completion after row i's prompt."""
    from roll.pipelines.common.data import unpaired_batch

    rows = [
        {"prompt": "What is 2+2?", "completion": "The answer is 4.", "label": True},
        {"prompt": "What is 3+5?", "completion": "The answer is 9.", "label": False},
    ]
    from roll.data.tokenizer import build_tokenizer

    prepared = _prepare(_jsonl(tmp_path / "kto.jsonl", rows))  # the loader shuffles: match rows by content
    decode = build_tokenizer().decode
    by_answer = {"4." in decode(r["completion_ids"]): r["label"] for r in prepared.train}
    assert by_answer == {True: True, False: False}
    batch = unpaired_batch(prepared.train, pad_id=0)
    assert batch.tensors[DESIRABLE].tolist() == [r["label"] for r in prepared.train]
    for b, row in enumerate(prepared.train):
        trained = batch.tensors[LABELS][b][batch.tensors[LABELS][b] != -100].tolist()
        assert trained == list(row["completion_ids"])
    donors = [prepared.train[1], prepared.train[0]]
    mismatched = unpaired_batch(prepared.train, pad_id=0, completions=donors)
    start, donor = len(prepared.train[0]["prompt_ids"]), list(donors[0]["completion_ids"])
    assert mismatched.tensors[LABELS][0, start : start + len(donor)].tolist() == donor


def test_a_label_that_is_not_a_bool_names_its_row(tmp_path: Path) -> None:
    """(A column mixing types is already refused by the JSONL reader; a column of strings reaches the encoder.)"""
    rows = [
        {"prompt": "a", "completion": "b", "label": "yes"},
        {"prompt": "c", "completion": "d", "label": "no"},
    ]
    with pytest.raises(DataError, match=r"row \d: label must be true \(desirable\) or false"):
        _prepare(_jsonl(tmp_path / "bad.jsonl", rows))


def test_pairs_become_two_unpaired_rows_and_identical_pairs_are_skipped(tmp_path: Path) -> None:
    rows = [
        {"prompt": "1+1", "chosen": "2", "rejected": "3"},
        {"prompt": "2+2", "chosen": "4", "rejected": "4"},
    ]
    prepared = _prepare(_jsonl(tmp_path / "pairs.jsonl", rows))
    assert [r["label"] for r in prepared.train] == [True, False]
    assert prepared.train[0]["prompt_ids"] == prepared.train[1]["prompt_ids"]
    assert prepared.skipped["identical_pairs"] == 1


def _forward(logp_B: list[float], lengths: list[int]) -> tuple[Any, dict[str, torch.Tensor]]:
    """A ForwardOutput whose rows' response log-probs sum to ``logp_B`` (spread over ``lengths`` tokens)."""
    from roll.workers.types import ForwardOutput

    T = max(lengths) + 1
    logp_BT = torch.zeros(len(logp_B), T)
    labels_BT = torch.full((len(logp_B), T), -100)
    for b, (total, n) in enumerate(zip(logp_B, lengths)):
        logp_BT[b, 1 : n + 1] = total / n
        labels_BT[b, 1 : n + 1] = 5
    return ForwardOutput(logp_BT=logp_BT), {LABELS: labels_BT}


def test_kto_and_simpo_loss_objects_by_hand() -> None:
    """KTO, rows (logp, ref, label) = (-4, -5, desirable), (-6, -5, undesirable), z0 = 0.5, beta 1:
    h = [1, -1]; desirable 1 - sig(1 - 0.5) = sig(-0.5); undesirable 1 - sig(0.5 + 1) = sig(-1.5). The LossFn
    returns the sum over its 2 units (rows).
    SimPO on two interleaved pairs, per-token means over 2 tokens: (c, r) = (-2, -3) and (-3, -1.5); beta 2,
    gamma 1: logits 2 * 1 - 1 = 1 and 2 * (-1.5) - 1 = -4; loss mean of softplus(-1), softplus(4); no reference
    column is read."""
    from roll.pipelines.dpo.losses import DPOLoss, KTOLoss

    def sig(x: float) -> float:
        return 1 / (1 + math.exp(-x))

    output, batch = _forward([-4.0, -6.0], [2, 3])
    batch.update({REF_SEQ_LOGP: torch.tensor([-5.0, -5.0]), DESIRABLE: torch.tensor([True, False])})
    kto = KTOLoss(beta=1.0, kl=0.5)
    total, metrics = kto(output, batch)
    assert kto.count_units(batch) == 2
    assert float(total) == pytest.approx(sig(-0.5) + sig(-1.5))
    assert float(metrics["kl"]) == 0.5 and float(metrics["reward_margin"]) == pytest.approx(2.0)
    output, batch = _forward([-4.0, -6.0, -6.0, -3.0], [2, 2, 2, 2])
    simpo = DPOLoss("simpo", beta=2.0, average_logp=True, gamma=1.0)
    total, _ = simpo(output, batch)
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
    assert float(total) / simpo.count_units(batch) == pytest.approx((softplus(-1.0) + softplus(4.0)) / 2)


def test_config_states_each_losss_needs() -> None:
    simpo = load_config(DPO_YAML, ["loss.type=simpo"], model=DPOConfig).loss
    assert (simpo.beta, simpo.averages, simpo.needs_reference) == (2.0, True, False)
    assert load_config(DPO_YAML, ["loss.type=simpo", "loss.beta=2.5"], model=DPOConfig).loss.beta == 2.5
    kto = load_config(DPO_YAML, KTO, model=DPOConfig).loss
    assert (kto.beta, kto.averages) == (0.1, False)
    with pytest.raises(ConfigError, match=r"batch\.samples_per_prompt"):
        load_config(DPO_YAML, ["loss.type=kto"], model=DPOConfig)
    with pytest.raises(ConfigError, match="average_logp"):
        load_config(DPO_YAML, ["loss.type=simpo", "loss.average_logp=false"], model=DPOConfig)
    with pytest.raises(ConfigError, match="desirable_weight applies to type 'kto'"):
        load_config(DPO_YAML, ["loss.desirable_weight=1.3"], model=DPOConfig)
    with pytest.raises(ConfigError, match="reference-free"):
        load_config(DPO_YAML, ["loss.type=simpo", "reference.mode=worker"], model=DPOConfig)


# ------------------------------------------------------------------------------------------ short runs (slow)

COMMON = [
    "max_steps=30",
    "eval_every=10",
    "tracking.progress=false",
    "tracking.backends=[jsonl]",
    "actor_train.cpus_per_worker=0.5",
    "data.sources.0.max_samples=512",
    "ray.num_cpus=null",
    "checkpoint.every_n_steps=30",
]


def _run(out: Path, *overrides: str) -> dict[int, dict[str, float]]:
    from roll.pipelines.dpo import SPEC

    cfg = load_config(DPO_YAML, [f"output_dir={out}", *COMMON, *overrides], model=DPOConfig)
    pipeline = SPEC.build(cfg)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["metrics"] for row in rows}


@pytest.mark.slow
def test_kto_learns_the_preference_from_split_pairs(ray_local: Any, tmp_path: Path) -> None:
    """KTO on the built-in pairs split into 64 labelled rows a step. At step 1 the policy is the reference, so
    h = 0 and z0 = max(0, 0) = 0 and every row's loss is 1 - sigmoid(0) = 0.5. Then the held-out margin between
    desirable and undesirable implicit rewards grows (measured 0.040, 0.054, 0.070 at steps 10, 20, 30) and the
    held-out loss falls below 0.5 (0.4913 at 30)."""
    metrics = _run(tmp_path / "kto", *KTO)
    assert metrics[1]["train/loss"] == pytest.approx(0.5, abs=1e-6)
    assert metrics[1]["train/kl"] == 0.0
    assert metrics[30]["eval/reward_margin"] > metrics[10]["eval/reward_margin"] > 0
    assert metrics[30]["eval/loss"] < 0.5


@pytest.mark.slow
def test_simpo_learns_without_a_reference(ray_local: Any, tmp_path: Path) -> None:
    """SimPO on the built-in pairs: no reference log-probs are computed or saved, the held-out margin of
    length-normalized rewards grows (measured 0.088, 0.109, 0.115 at steps 10, 20, 30) and held-out accuracy is
    above chance (0.61 at 30), the training loss falls (mean of steps 21-30 below steps 1-10)."""
    out = tmp_path / "simpo"
    metrics = _run(out, "loss.type=simpo")
    assert metrics[30]["eval/reward_margin"] > metrics[10]["eval/reward_margin"] > 0
    assert metrics[30]["eval/reward_accuracy"] > 0.55
    loss = [metrics[s]["train/loss"] for s in range(1, 31)]
    assert sum(loss[20:]) < sum(loss[:10])
    assert not list(out.glob("**/reference_logps.pt")), "SimPO is reference-free"
