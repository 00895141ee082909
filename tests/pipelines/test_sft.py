"""The ``sft`` pipeline end to end on the tiny model: learning, data parallelism, export, exact resume after
SIGKILL, the loss against the published formula, and bad input.

One trained run (examples/sft.yaml: one-digit sums, two data-parallel Ray actors, 100 steps) is shared by the
module; the SIGKILL test runs the same config through ``python -m roll.core.cli`` and must reproduce its metrics
step for step after resuming (the ``kill_and_resume`` fixture of ``conftest.py``, shared with dpo and
reward_model).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core.config.loader import load_config
from roll.core.errors import CheckpointError, DataError
from roll.pipelines.sft import SFTConfig

ROOT = Path(__file__).resolve().parents[2]
SFT_YAML = ROOT / "examples" / "sft.yaml"
STEPS = 100
COMMON = [
    f"max_steps={STEPS}",
    "eval_every=20",
    "checkpoint.every_n_steps=10",
    "checkpoint.export_hf=true",
    "tracking.progress=false",
    "tracking.backends=[jsonl]",
    "tracking.log_samples_count=64",  # every greedy answer of an evaluation (17)
    "actor_train.num_workers=2",
    "actor_train.cpus_per_worker=0.5",
]


def _config(out: Path, *overrides: str) -> SFTConfig:
    return load_config(
        SFT_YAML, [f"output_dir={out}", "ray.num_cpus=null", *COMMON, *overrides], model=SFTConfig
    )


def _metrics(out: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["metrics"] for row in rows}


@pytest.fixture(scope="module")
def trained(ray_local: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from roll.pipelines.sft import SPEC

    out = tmp_path_factory.mktemp("sft") / "run"
    pipeline = SPEC.build(_config(out))
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    return out


@pytest.mark.slow
def test_loss_falls_and_answer_accuracy_rises(trained: Path) -> None:
    """Held-out one-digit sums (never trained on) answered greedily: 0 of 17 early, several by step 100
    (measured 0/17 at step 20, 6/17 at step 100 with this seed; the 150-step example reaches 16/17)."""
    metrics = _metrics(trained)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    assert metrics[STEPS]["train/loss"] < 0.2 * metrics[1]["train/loss"]
    assert metrics[STEPS]["eval/loss"] < 0.5 * metrics[20]["eval/loss"]
    assert metrics[STEPS]["eval/token_accuracy"] > metrics[20]["eval/token_accuracy"]
    assert metrics[20]["eval/answer_accuracy"] < 0.1
    assert metrics[STEPS]["eval/answer_accuracy"] > 0.15


@pytest.mark.slow
def test_each_evaluation_logs_its_greedy_answers(trained: Path) -> None:
    """samples.jsonl: the 17 greedy answers of each evaluation (steps 20..100), their share of ``correct`` the
    step's ``eval/answer_accuracy``; no train rows (SFT has no samples of its own to show)."""
    from roll.core.samples import read_samples

    rows, metrics = read_samples(trained / "samples.jsonl"), _metrics(trained)
    assert {r["kind"] for r in rows} == {"eval"} and sorted({r["step"] for r in rows}) == [
        20,
        40,
        60,
        80,
        100,
    ]
    for step in (20, 100):
        mine = [r for r in rows if r["step"] == step]
        assert len(mine) == 17 and all(r["prompt"] and "ground_truth" in r for r in mine)
        assert sum(r["correct"] for r in mine) / 17 == pytest.approx(metrics[step]["eval/answer_accuracy"])


@pytest.mark.slow
def test_export_loads_in_plain_transformers_and_every_parameter_changed(trained: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll.data.tiny import tiny_model_path

    export = trained / "hf"
    assert (export / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(export)
    tokenizer = AutoTokenizer.from_pretrained(export)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path("tiny-1m"))
    before = dict(initial.named_parameters())
    for name, param in model.named_parameters():
        assert not torch.equal(param, before[name]), f"{name} did not change"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_metrics(trained: Path, tmp_path: Path, kill_and_resume: Any) -> None:
    """SIGKILL a real `roll train` after its first checkpoint; `resume=auto` then matches the uninterrupted run."""
    assert kill_and_resume(SFT_YAML, COMMON, _metrics(trained), tmp_path) < STEPS


@pytest.mark.slow
def test_a_damaged_last_checkpoint_is_skipped_and_the_resume_matches(
    trained: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shared run's last checkpoint (step 100) gets one byte of its weights flipped, in the tensor data: the
    size is unchanged, so only the checksum can tell. ``resume=auto`` names it and why, continues from step 90
    instead of loading it (before checksums, it loaded it and trained on), and logs steps 91..100 exactly as the
    uninterrupted run did; each step appears once in the metrics file."""
    import logging
    import shutil

    from roll.core.checkpoint import verify
    from roll.pipelines.sft import SPEC

    out = tmp_path / "run"
    shutil.copytree(trained, out)
    weights = out / "checkpoints" / "step_000100" / "actor_train" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) * 3 // 4] ^= 0xFF
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="roll.core.checkpoint"):
        pipeline = SPEC.build(_config(out, "resume=auto", "checkpoint.export_hf=false"))
        try:
            pipeline.run()
        finally:
            pipeline.shutdown()
    assert (
        f"skipping damaged checkpoint {out / 'checkpoints' / 'step_000100'}: actor_train/model.safetensors does not "
        "match its xxh3_128 checksum" in caplog.text
    )
    resumed_from = out / "checkpoints" / "step_000090"
    assert f"roll: sft: resuming from {resumed_from} (step 90 of {STEPS})" in capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    checkpoints = out / "checkpoints"  # the damaged one kept aside; the continued run's own step 100 saved
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "step_000090",
        "step_000100",
        "step_000100.damaged",
    ]
    assert verify(checkpoints / "step_000100").step == STEPS
    expected, got = _metrics(trained), _metrics(out)
    for step in range(91, STEPS + 1):
        for name, value in expected[step].items():
            if not name.startswith(("time/", "throughput/")):
                assert got[step][name] == value, (step, name)


# ------------------------------------------------------------------------------------------- no Ray needed


def test_loss_equals_token_cross_entropy_by_hand() -> None:
    """SFTLoss / count_units on a fixed batch equals ``mean_t -log softmax(logits_t)[y_t]`` over label tokens,
    evaluated with an explicit loop, and :func:`sft_cross_entropy` on the shifted labels."""
    from roll.core.columns import LABELS
    from roll.pipelines.algorithms.preference import sft_cross_entropy
    from roll.pipelines.sft.losses import SFTLoss
    from roll.workers.logprobs import forward_scores
    from roll.workers.types import ForwardOutput

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 16), torch.nn.Linear(16, 11))

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids: torch.Tensor, **_: Any) -> Any:
            return type("Out", (), {"logits": self.inner(input_ids)})()

    ids_BT = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 0, 0]])
    mask_BT = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    labels_BT = torch.tensor([[-100, -100, 3, 4, 5], [-100, 7, 8, -100, -100]])
    logp_BT, _ = forward_scores(Wrapped(), ids_BT, mask_BT)
    loss_fn = SFTLoss()
    batch = {LABELS: labels_BT}
    mean = loss_fn(ForwardOutput(logp_BT=logp_BT), batch)[0] / loss_fn.count_units(batch)
    logits_BTV = model(ids_BT)
    by_hand = [
        -torch.log_softmax(logits_BTV[b, t - 1], -1)[labels_BT[b, t]]
        for b in range(2)
        for t in range(5)
        if labels_BT[b, t] != -100
    ]
    torch.testing.assert_close(mean, torch.stack(by_hand).mean())
    shifted_BT = torch.full_like(labels_BT, -100)
    shifted_BT[:, :-1] = labels_BT[:, 1:]
    torch.testing.assert_close(mean, sft_cross_entropy(logits_BTV, shifted_BT))


def _tokenizer() -> Any:
    from roll.data.tokenizer import build_tokenizer

    return build_tokenizer()


def test_missing_field_is_a_clear_data_error(tmp_path: Path) -> None:
    from roll.data.config import DataConfig, TokenizeConfig
    from roll.pipelines.common.data import prepare_data

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"question": "1+1", "answer": "2"}) + "\n")
    data = DataConfig(sources=[{"path": str(path)}])
    with pytest.raises(DataError, match=r"messages|prompt"):
        prepare_data(data, TokenizeConfig(), kind="sft", tokenizer=_tokenizer())


def test_length_policy_applies_to_long_sequences(tmp_path: Path) -> None:
    from roll.data.config import DataConfig, TokenizeConfig
    from roll.pipelines.common.data import prepare_data

    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": "1+1", "response": "2"}, {"prompt": "2+2", "response": "long " * 50}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    data = DataConfig(sources=[{"path": str(path)}], shuffle=False)
    dropped = prepare_data(
        data, TokenizeConfig(max_length=32, length_policy="drop"), kind="sft", tokenizer=_tokenizer()
    )
    assert (len(dropped.train), dropped.report.dropped) == (1, 1)
    cut = prepare_data(
        data, TokenizeConfig(max_length=32, length_policy="truncate"), kind="sft", tokenizer=_tokenizer()
    )
    assert cut.report.truncated == 1 and max(len(r["input_ids"]) for r in cut.train) == 32
    with pytest.raises(DataError, match="length_policy=error"):
        prepare_data(
            data, TokenizeConfig(max_length=32, length_policy="error"), kind="sft", tokenizer=_tokenizer()
        )


@pytest.mark.slow
def test_resume_from_a_missing_path_or_another_pipeline_is_refused(trained: Path, tmp_path: Path) -> None:
    from roll.pipelines.dpo import SPEC as DPO_SPEC
    from roll.pipelines.dpo import DPOConfig
    from roll.pipelines.sft import SPEC

    missing = _config(tmp_path / "a", f"resume={tmp_path / 'nope'}")
    with pytest.raises(CheckpointError, match="nope"):
        SPEC.build(missing).checkpoints.resolve_resume(missing.resume, "sft")
    sft_checkpoint = sorted((trained / "checkpoints").glob("step_*"))[-1]
    dpo = DPOConfig(output_dir=tmp_path / "dpo", resume=sft_checkpoint)
    with pytest.raises(CheckpointError, match="sft"):
        DPO_SPEC.build(dpo).checkpoints.resolve_resume(dpo.resume, "dpo")


def test_two_workers_need_a_divisible_batch() -> None:
    from roll.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"actor_train\.num_workers"):
        load_config(SFT_YAML, ["actor_train.num_workers=3"], model=SFTConfig)


def test_sft_eval_dispatches_by_model_parallel_groups() -> None:
    """The SFT worker's held-out loss splits rows by DP rank and calls every TP/PP rank (Megatron)."""
    from roll.core.cluster import Dispatch
    from roll.core.cluster.dispatch import get_spec, registered_methods
    from roll.pipelines.sft.worker import SFTEvaluation, SFTWorker

    assert get_spec(SFTEvaluation.eval_step).mode is Dispatch.MP_SPLIT  # type: ignore[union-attr]
    assert registered_methods(SFTWorker)["eval_step"].mode is Dispatch.MP_SPLIT  # the role holds the part
