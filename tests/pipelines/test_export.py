"""``roll export`` end to end, one short run per training mode.

Each case trains one step on a tiny model (the mode's example YAML with its warm-ups off and its batch cut to a
few rows, checkpointing on: the final checkpoint), runs ``roll export RUN OUT`` through the CLI's ``main``, then
reloads ``OUT`` in a fresh Python process that imports no roll module, only transformers, with the loader class
the mode documents (``AutoModelForCausalLM``, ``AutoModelForSequenceClassification`` for a reward model,
``AutoModelForTokenClassification`` for PPO's critic, ``AutoModelForImageTextToText`` for a VLM), and
``AutoTokenizer``. Checked against the trainer's weights, read from the run's checkpoint through roll (the role's
model built by roll from the run config, loaded with the checkpoint's ``model.safetensors``, LoRA merged):

- the logits on a fixed prompt are equal to 1e-5 (measured for sft: max |diff| 0.0, the same fp32 weights);
- the plain tokenizer gives the same ids as roll's, and the chat template survives;
- every weight of the reloaded model equals the checkpoint's, and the trained weights differ from the untrained model's (so
  an export of the base model would fail).

RL runs take a one-step SFT warm-up first: a first GRPO step of an untrained model scores every sample 0, so its
advantages are 0 and nothing would change. Only sft is in the default tier (with the refusal tests that share
its run); each other mode takes 40-90 s on a loaded 2-core box (actor start-up, for most of it) and is ``slow``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core.cli import load_run_config, main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PROMPT = "What is 3 + 4?"
RUN = [
    "max_steps=1",
    "eval_every=0",
    "tracking.progress=false",
    "tracking.backends=[jsonl]",
    "checkpoint.export_hf=false",
    "ray.address=auto",
    "ray.num_cpus=null",
]
RL_BATCH = [
    "batch.prompts_per_step=4",
    "batch.samples_per_prompt=2",
    "batch.micro_batch_samples=8",
    "plot=false",
]
PAIR_BATCH = ["batch.prompts_per_step=4", "batch.micro_batch_samples=8"]


@dataclass(frozen=True)
class Case:
    """A mode's short run and the role to export: ``files`` under the checkpoint, config ``section``, ``head``."""

    yaml: str
    overrides: list[str]
    files: str
    section: str
    loader: str
    head: str = "causal_lm"
    role: str | None = None
    marks: list[Any] = field(default_factory=list)


CASES = {
    "sft": Case("sft.yaml", ["batch.prompts_per_step=8", "batch.micro_batch_samples=8"], "actor_train", "actor_train",
                "AutoModelForCausalLM"),
    "dpo": Case("dpo.yaml", PAIR_BATCH, "actor_train", "actor_train", "AutoModelForCausalLM",
                marks=[pytest.mark.slow]),
    "rlvr": Case("quickstart.yaml", ["warmup.steps=1", *RL_BATCH], "actor", "actor_train", "AutoModelForCausalLM",
                 marks=[pytest.mark.slow]),
    "sft_lora": Case(
        "sft.yaml",
        ["batch.prompts_per_step=8", "batch.micro_batch_samples=8", "+actor_train.strategy.lora={r: 4, alpha: 8}"],
        "actor_train", "actor_train", "AutoModelForCausalLM", marks=[pytest.mark.slow],
    ),
    "reward_model": Case("reward_model.yaml", PAIR_BATCH, "reward_model", "actor_train",
                         "AutoModelForSequenceClassification", head="score", marks=[pytest.mark.slow]),
    "ppo_actor": Case("ppo.yaml", ["warmup.steps=1", "critic_warmup_steps=0", "batch.samples_per_optimizer_step=8",
                                   *RL_BATCH], "actor", "actor_train", "AutoModelForCausalLM",
                      marks=[pytest.mark.slow]),
    "ppo_critic": Case("ppo.yaml", ["warmup.steps=1", "critic_warmup_steps=0", "batch.samples_per_optimizer_step=8",
                                    *RL_BATCH], "critic", "critic", "AutoModelForTokenClassification",
                       head="value", role="critic", marks=[pytest.mark.slow]),
    "distill": Case("distill.yaml", ["teacher_warmup=null", "batch.prompts_per_step=4",
                                     "batch.micro_batch_samples=4"], "student", "student", "AutoModelForCausalLM",
                    marks=[pytest.mark.slow]),
    "distill_onpolicy": Case("distill_onpolicy.yaml", ["warmup.steps=1", "teachers.arith.warmup=null", *RL_BATCH],
                             "actor", "actor_train", "AutoModelForCausalLM", marks=[pytest.mark.slow]),
    "agentic": Case("agentic_guess.yaml", ["warmup.steps=1", *RL_BATCH[:-1]], "actor", "actor_train",
                    "AutoModelForCausalLM", marks=[pytest.mark.slow]),
    "rlvr_vlm": Case("vlm_rlvr.yaml", ["warmup.steps=1", *RL_BATCH], "actor", "actor_train",
                     "AutoModelForImageTextToText", marks=[pytest.mark.slow]),
}  # fmt: skip


_RUNS: dict[str, Path] = {}


def _train(yaml: str, overrides: list[str], tmp: Path) -> Path:
    """Train once per (yaml, overrides) in this pytest run (ppo's actor and critic share one run)."""
    key = f"{yaml} {overrides}"
    if key not in _RUNS:
        out = tmp / yaml.removesuffix(".yaml")
        spec, cfg = load_run_config(EXAMPLES / yaml, [f"output_dir={out}", *RUN, *overrides])
        pipeline = spec.build(cfg)
        try:
            pipeline.run()
        finally:
            pipeline.shutdown()
        _RUNS[key] = out
    return _RUNS[key]


_PLAIN = textwrap.dedent(
    """
    import json, sys
    import torch, transformers
    out, loader, prompt, dst = sys.argv[1:]
    model = getattr(transformers, loader).from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    ids = tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    chat = None
    if tokenizer.chat_template:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False)
    processor = None
    if loader == "AutoModelForImageTextToText":
        processor = type(transformers.AutoImageProcessor.from_pretrained(out)).__name__
    roll = sorted(m for m in sys.modules if m == "roll" or m.startswith("roll."))
    state = model.state_dict()
    torch.save({"logits": logits, "ids": ids, "chat": chat, "processor": processor, "roll": roll, "state": state}, dst)
    """
)


def _load_plain(out: Path, loader: str, tmp: Path) -> dict[str, Any]:
    """Load ``out`` in a fresh interpreter with transformers alone; its logits, prompt ids and loaded modules."""
    dst = tmp / "plain.pt"
    subprocess.run(
        [sys.executable, "-c", _PLAIN, str(out), loader, PROMPT, str(dst)], check=True, timeout=300
    )
    result: dict[str, Any] = torch.load(dst, weights_only=False)
    return result


def _trainer_model(run: Path, case: Case) -> tuple[torch.nn.Module, Any, dict[str, torch.Tensor]]:
    """The role's model built by roll from the run's config, with the checkpoint's weights (LoRA merged)."""
    from safetensors.torch import load_file

    from roll.core.checkpoint import CheckpointManager
    from roll.workers.fsdp2 import merge_lora_state_dict
    from roll.workers.roles.model import load_model, load_tokenizer

    latest = CheckpointManager(run / "checkpoints", keep_last=3).latest()
    assert latest is not None
    _, cfg = load_run_config(latest / "run_config.yaml", [])
    section = getattr(cfg, case.section)
    if case.section == "critic":
        section = section.resolved(cfg.actor_train)
    state = load_file(str(latest / case.files / "model.safetensors"))
    lora = getattr(section.strategy, "lora", None)
    if lora is not None:
        assert any(".lora_A." in k for k in state), "a LoRA run's checkpoint holds the adapter unmerged"
        state = merge_lora_state_dict(state, lora)
    model = load_model(section.model, case.section, head=case.head).eval()  # type: ignore[arg-type]
    base = {k: v.clone() for k, v in model.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    changed = [k for k, v in state.items() if not torch.equal(v, base[k])]
    assert changed, "one training step changed no weight: the checkpoint holds the untrained model"
    return model, load_tokenizer(section.model, case.section), state


@pytest.mark.parametrize("name", [pytest.param(n, marks=c.marks) for n, c in CASES.items()])
def test_export_reloads_in_plain_transformers_with_the_trainers_logits(
    name: str, ray_local: Any, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    case = CASES[name]
    run = _train(case.yaml, case.overrides, tmp_path_factory.getbasetemp())
    out = tmp_path_factory.mktemp(name) / "export"
    role = ["--role", case.role] if case.role else []
    assert main(["export", str(run), str(out), *role]) == 0
    printed = capsys.readouterr().out
    assert f"transformers.{case.loader}.from_pretrained({str(out)!r})" in printed, printed
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }

    plain = _load_plain(out, case.loader, out.parent)
    model, tokenizer, state = _trainer_model(run, case)
    assert plain["roll"] == [], f"loading the export imported roll: {plain['roll']}"
    assert plain["ids"] == tokenizer(PROMPT)["input_ids"], "the exported tokenizer splits differently"
    if tokenizer.chat_template:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False)
        assert plain["chat"] == chat
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([plain["ids"]])).logits
    torch.testing.assert_close(plain["logits"], expected, rtol=0, atol=1e-5)

    # by the names of the loaded model (transformers may rename on save, as for Qwen2-VL), every weight equal
    loaded = plain["state"]
    differ = [k for k, v in state.items() if k not in loaded or not torch.equal(v, loaded[k])]
    assert not differ and set(loaded) <= set(state) | {"lm_head.weight"}, (differ, set(loaded) - set(state))
    if name == "rlvr_vlm":
        assert (out / "preprocessor_config.json").is_file(), "a VLM's export carries its image processor"
        assert plain["processor"] and "Processor" in plain["processor"], plain["processor"]


def test_a_damaged_checkpoint_is_refused_and_an_older_intact_one_taken(
    ray_local: Any, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bytes of the weights changed (same size): the checkpoint named alone is refused with exit 1 and one
    line naming the file; as the newest of a run, it is skipped with a warning for the intact one before it;
    a run with no intact checkpoint is refused. Nothing is written to OUT in either refusal."""
    import shutil

    case = CASES["sft"]
    run = _train(case.yaml, case.overrides, tmp_path_factory.getbasetemp())
    copy = tmp_path_factory.mktemp("damaged") / "run"
    shutil.copytree(run, copy)
    good = copy / "checkpoints" / "step_000001"
    bad = copy / "checkpoints" / "step_000002"
    shutil.copytree(good, bad)
    manifest = json.loads((bad / "roll_checkpoint.json").read_text())
    (bad / "roll_checkpoint.json").write_text(json.dumps({**manifest, "step": 2}))
    weights = bad / "actor_train" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    out = copy.parent / "out"

    assert main(["export", str(bad), str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "damaged" in err[0] and "actor_train/model.safetensors" in err[0], err
    assert not out.exists()

    assert main(["export", str(copy), str(out)]) == 0
    captured = capsys.readouterr()
    assert "skipping damaged checkpoint step_000002" in captured.err and "step 1" in captured.out
    assert (out / "model.safetensors").is_file() and bad.is_dir(), "export leaves the run dir as it was"

    shutil.rmtree(good)
    assert main(["export", str(copy), str(copy.parent / "out2")]) == 1
    assert "no intact checkpoint" in capsys.readouterr().err
    assert not (copy.parent / "out2").exists()


def test_a_non_empty_out_is_refused_unless_overwrite(
    ray_local: Any, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    case = CASES["sft"]
    run = _train(case.yaml, case.overrides, tmp_path_factory.getbasetemp())
    out = tmp_path_factory.mktemp("busy") / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["export", str(run), str(out)]) == 1
    assert "not empty" in capsys.readouterr().err and (out / "notes.txt").read_text() == "mine"
    assert main(["export", str(run), str(out), "--role", "critic", "--overwrite"]) == 2  # sft has no critic
    assert "exports actor" in capsys.readouterr().err and (out / "notes.txt").read_text() == "mine"
    assert main(["export", str(run), str(out), "--overwrite"]) == 0
    assert (out / "model.safetensors").is_file() and not (out / "notes.txt").exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "no staging dir is left behind"
