"""Validation reports and batch-size arithmetic."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Annotated, Literal, Self

import pytest
from pydantic import Field, ValidationError, model_validator

from roll.core.config import (
    BatchConfig,
    DerivedBatch,
    RoleConfig,
    RollModel,
    RunConfig,
    issues_error,
    load_config,
    load_tree,
    validate,
)
from roll.core.config.validate import validate_data
from roll.core.errors import ConfigError, ConfigIssue


class AdamConfig(RollModel):
    type: Literal["adam"] = "adam"
    lr: float = Field(1e-5, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)


class SgdConfig(RollModel):
    type: Literal["sgd"]
    lr: float = Field(gt=0)
    momentum: float = 0.0


class StageConfig(RollModel):
    name: str
    steps: int = Field(ge=1)


class TrainerConfig(RollModel):
    optimizer: Annotated[AdamConfig | SgdConfig, Field(discriminator="type")] = Field(
        default_factory=AdamConfig
    )
    stages: list[StageConfig] = Field(default_factory=list)
    extra_args: dict[str, int] = Field(default_factory=dict)
    grad_clip: float | None = None


class ToyRun(RunConfig):
    """A pipeline's config: RunConfig plus its sections, and a cross-section batch check."""

    batch: BatchConfig
    actor_train: RoleConfig = Field(default_factory=RoleConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)

    @model_validator(mode="after")
    def _batch_fits_the_workers(self) -> Self:
        issues = self.batch.check(self.actor_train.num_workers, where="actor_train.num_workers")
        if issues:
            raise issues_error(issues)
        return self


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def issues_of(path: Path, overrides: tuple[str, ...] = ()) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides, model=ToyRun)
    return info.value.issues


GOOD = """
pipeline: toy
batch: {prompts_per_step: 4, samples_per_prompt: 4, micro_batch_samples: 2}
actor_train: {num_workers: 2}
"""


def test_a_good_config_loads(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, "good.yaml", GOOD), ["trainer.optimizer={type: sgd, lr: 0.1}"], ToyRun
    )
    assert isinstance(config.trainer.optimizer, SgdConfig)
    assert config.batch.samples_per_optimizer_step == 16


def test_every_problem_is_reported_at_once_with_path_location_and_hint(tmp_path: Path) -> None:
    main = write(
        tmp_path,
        "bad.yaml",
        """
        seed: abc
        max_stpes: 3
        batch:
          prompts_per_step: 4
          micro_batch_samples: 2
        trainer:
          optimizer:
            type: sgd
            lr: -1
            momentun: 0.9
          stages:
            - {name: warmup, steps: 0}
            - {name: main, step: 10}
          extra_args: {a: x}
          grad_clip: [1]
        resume: 5
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_config(main, ["ray.num_cpus=zero"], ToyRun)
    error = info.value
    by_path = {issue.path: issue for issue in error.issues}
    assert list(by_path) == [
        "pipeline",
        "seed",
        "resume",
        "ray.num_cpus",
        "trainer.optimizer.lr",
        "trainer.optimizer.momentun",
        "trainer.stages.0.steps",
        "trainer.stages.1.steps",
        "trainer.stages.1.step",
        "trainer.extra_args.a",
        "trainer.grad_clip",
        "max_stpes",
    ]
    src = {path: (issue.source or "").rpartition("/")[2] for path, issue in by_path.items()}
    assert by_path["pipeline"].message == "required key 'pipeline' is missing"
    assert src["pipeline"] == "bad.yaml"
    assert by_path["seed"].message.startswith(
        "expected int, got 'abc' (str): input should be a valid integer"
    )
    assert src["seed"] == "bad.yaml:1"
    assert by_path["resume"].message.startswith("expected 'auto' | 'never' | Path, got 5 (int): ")
    assert by_path["ray.num_cpus"].source == "<override 1: ray.num_cpus=zero>"
    assert by_path["ray.num_cpus"].message.startswith("expected float | None, got 'zero' (str)")
    assert by_path["trainer.optimizer.lr"].message == "input should be greater than 0, got -1"
    assert src["trainer.optimizer.lr"] == "bad.yaml:9"
    assert by_path["trainer.optimizer.momentun"].message == "unknown key 'momentun'"
    # Suggestions come from the sgd variant's fields: the discriminator in the data picks the model.
    assert by_path["trainer.optimizer.momentun"].hint == "did you mean 'momentum'?"
    assert src["trainer.optimizer.momentun"] == "bad.yaml:10"
    assert src["trainer.stages.0.steps"] == "bad.yaml:12"
    assert by_path["trainer.stages.1.steps"].message == "required key 'steps' is missing"
    assert by_path["trainer.stages.1.step"].hint == "did you mean 'steps'?"
    assert by_path["trainer.extra_args.a"].message.startswith("expected int, got 'x' (str)")
    assert by_path["trainer.grad_clip"].message.startswith("expected float | None, got [1] (list)")
    assert by_path["max_stpes"].hint == "did you mean 'max_steps'?"
    assert src["max_stpes"] == "bad.yaml:2"
    report = str(error)
    assert report.startswith("12 problems in config:\n  - pipeline (")
    assert (
        "  - max_stpes (" in report
        and "bad.yaml:2): unknown key 'max_stpes'\n        hint: did you mean 'max_steps'?" in report
    )


def test_unknown_key_without_close_match_lists_the_allowed_keys(tmp_path: Path) -> None:
    main = write(
        tmp_path,
        "main.yaml",
        "pipeline: toy\nray: {zzz: 1}\n" + "batch: {prompts_per_step: 1, micro_batch_samples: 1}\n",
    )
    (issue,) = issues_of(main)
    assert issue.path == "ray.zzz"
    assert issue.hint == (
        "allowed keys here: address, num_cpus, num_gpus, object_store_mb, namespace, init_timeout_s, call_timeout_s"
    )


def test_validate_takes_a_tree(tmp_path: Path) -> None:
    tree = load_tree(write(tmp_path, "good.yaml", GOOD))
    assert validate(tree, ToyRun).actor_train.num_workers == 2
    with pytest.raises(ConfigError, match=r"unknown key 'batch'(.|\n)*unknown key 'actor_train'"):
        validate(tree, RunConfig)  # RunConfig has no `batch`: unknown keys, each named


# --- batch sizes -----------------------------------------------------------------------------------------


def test_batch_derived_values() -> None:
    """P=8, G=4: 32 samples per step; 16 per optimizer step -> 2 optimizer steps per step. On 2 workers each
    takes 16 / 2 = 8 samples per optimizer step, in 8 / 2 = 4 micro-batches of 2."""
    batch = BatchConfig(
        prompts_per_step=8, samples_per_prompt=4, samples_per_optimizer_step=16, micro_batch_samples=2
    )
    assert (batch.samples_per_step, batch.optimizer_steps_per_step) == (32, 2)
    assert batch.per_worker(2) == DerivedBatch(
        dp_size=2,
        samples_per_step=32,
        samples_per_optimizer_step=16,
        optimizer_steps_per_step=2,
        samples_per_worker=8,
        micro_batch_samples=2,
        micro_batch_tokens=None,
        grad_accumulation_steps=4,
    )


def test_batch_defaults_to_one_optimizer_step_and_dynamic_batching() -> None:
    batch = BatchConfig(prompts_per_step=6, samples_per_prompt=2, micro_batch_tokens=4096)
    assert batch.samples_per_optimizer_step == 12 and batch.optimizer_steps_per_step == 1
    derived = batch.per_worker(3)
    assert (derived.samples_per_worker, derived.grad_accumulation_steps, derived.micro_batch_tokens) == (
        4,
        None,
        4096,
    )
    assert batch.check(3, where="w", max_seq_len=8192)[0].message == (
        "micro_batch_tokens = 4096 is less than max_seq_len = 8192: a sequence would not fit"
    )


def batch_issues(**fields: int) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as info:
        validate_data(fields, BatchConfig)
    return info.value.issues


def test_batch_field_level_rejections() -> None:
    (issue,) = batch_issues(
        prompts_per_step=6, samples_per_prompt=4, samples_per_optimizer_step=16, micro_batch_samples=1
    )
    assert issue.path == "samples_per_optimizer_step"
    assert issue.message == (
        "samples_per_step = prompts_per_step × samples_per_prompt = 6 × 4 = 24 "
        "is not a multiple of samples_per_optimizer_step = 16"
    )
    assert issue.hint == "use a divisor of 24: 12 or 24"
    (issue,) = batch_issues(prompts_per_step=2, micro_batch_samples=1, micro_batch_tokens=100)
    assert issue.message == "set exactly one of micro_batch_samples or micro_batch_tokens; both are set"
    (issue,) = batch_issues(prompts_per_step=2)
    assert issue.message.endswith("neither is set")
    issues = batch_issues(prompts_per_step=0, micro_batch_samples=1)
    assert [(i.path, i.message) for i in issues] == [
        ("prompts_per_step", "input should be greater than or equal to 1, got 0")
    ]


def test_batch_rejections_that_depend_on_the_worker_count(tmp_path: Path) -> None:
    main = write(tmp_path, "main.yaml", GOOD)
    (issue,) = issues_of(main, ("actor_train.num_workers=3",))
    assert issue.path == "batch.samples_per_optimizer_step"
    assert issue.message == (
        "samples_per_optimizer_step 16 / 3 data-parallel workers (actor_train.num_workers) is not whole; use 15 or 18"
    )
    assert issue.hint == "or set actor_train.num_workers to a divisor of 16: 1, 2, 4, 8, 16"
    assert (issue.source or "").endswith("main.yaml:2")
    (issue,) = issues_of(main, ("batch.micro_batch_samples=3",))
    assert issue.path == "batch.micro_batch_samples"
    assert issue.message == (
        "samples per worker per optimizer step = samples_per_optimizer_step / data-parallel workers = "
        "16 / 2 = 8 is not a multiple of micro_batch_samples = 3; use 2 or 4"
    )
    assert issue.source == "<override 1: batch.micro_batch_samples=3>"
    (issue,) = issues_of(main, ("batch.micro_batch_samples=16",))
    assert issue.message.endswith("= 8 is not a multiple of micro_batch_samples = 16; use 8")
    with pytest.raises(ConfigError, match="16 / 3 data-parallel workers"):
        BatchConfig(prompts_per_step=4, samples_per_prompt=4, micro_batch_samples=1).per_worker(3)


def test_issues_error_is_a_pydantic_error_with_paths() -> None:
    error = issues_error([ConfigIssue("a.b", "bad {thing}", "fix it")])
    assert isinstance(error, ValidationError)
    (detail,) = error.errors()
    assert detail["loc"] == ("a", "b") and detail["msg"] == "bad {thing}"


class _TwoRules(RollModel):
    a: int = 0

    @model_validator(mode="after")
    def _rules(self) -> Self:
        raise issues_error([ConfigIssue("a", "first rule"), ConfigIssue("a", "second rule", "try 2")])


def test_issues_from_one_validator_at_one_path_are_all_kept() -> None:
    with pytest.raises(ConfigError) as info:
        validate_data({"a": 1}, _TwoRules, {"a": "x.yaml:4"})
    assert [(i.path, i.message, i.hint, i.source) for i in info.value.issues] == [
        ("a", "first rule", None, "x.yaml:4"),
        ("a", "second rule", "try 2", "x.yaml:4"),
    ]


class _MovedRun(ToyRun):
    """ToyRun whose older layout had ``lr`` at the top and ``trainer.clip`` beside the optimizer."""

    @classmethod
    def moved_keys(cls) -> dict[str, str]:
        return {"lr": "trainer.optimizer.lr", "trainer.clip": "trainer.grad_clip"}


def test_moved_keys_are_refused_with_their_new_path_in_yaml_and_overrides(tmp_path: Path) -> None:
    """A moved key, top-level or dotted, written in the YAML or set by an override, is refused naming where it
    lives now (not a bare 'unknown key', not 'write +lr=...'); the same keys at their new place load."""
    old = write(tmp_path, "old.yaml", GOOD + "lr: 0.1\ntrainer: {clip: 1.0}\n")
    with pytest.raises(ConfigError) as info:
        load_config(old, (), model=_MovedRun)
    assert [(i.path, i.message, i.hint) for i in info.value.issues] == [
        ("lr", "'lr' is no longer a top-level key", "move it to trainer.optimizer.lr"),
        ("trainer.clip", "'trainer.clip' is no longer a key of trainer", "move it to trainer.grad_clip"),
    ]
    good = write(tmp_path, "good.yaml", GOOD)
    with pytest.raises(ConfigError) as info:
        load_config(good, ("lr=0.1", "trainer.clip=1.0"), model=_MovedRun)
    assert [(i.path, i.message, i.hint, i.source) for i in info.value.issues] == [
        (
            "lr",
            "no key 'lr' to override: it has moved",
            "move it to trainer.optimizer.lr",
            "<override 1: lr=0.1>",
        ),
        (
            "trainer.clip",
            "no key 'trainer.clip' to override: it has moved",
            "move it to trainer.grad_clip",
            "<override 2: trainer.clip=1.0>",
        ),
    ]
    new = ("trainer.optimizer={type: adam, lr: 0.1}", "trainer.grad_clip=1.0")
    config = load_config(good, new, model=_MovedRun)
    assert (config.trainer.optimizer.lr, config.trainer.grad_clip) == (0.1, 1.0)
