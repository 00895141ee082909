"""Config sections every pipeline shares: the run, Ray, roles, tracking, checkpoints and batch sizes.

A pipeline's config model extends :class:`RunConfig` with its own sections. Nothing here imports torch or Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from roll.core.config.base import RollModel
from roll.core.config.validate import issues_error, moved_keys_error
from roll.core.errors import ConfigIssue


class RayConfig(RollModel):
    """How to reach Ray. ``address=None`` uses ``RAY_ADDRESS`` when set, else starts a local Ray."""

    address: str | None = Field(
        None,
        description="Ray to attach to (`auto`, `host:port`, `ray://...`); `local` forces a fresh local Ray; unset: "
        "RAY_ADDRESS when set, else a new local Ray private to this run",
    )
    num_cpus: float | None = Field(None, gt=0, description="CPUs of a local Ray started on demand")
    num_gpus: int | None = Field(None, ge=0, description="GPUs of a local Ray started on demand")
    object_store_mb: int | None = Field(
        None, ge=80, description="object store of a local Ray started on demand (default: Ray's, 30% of RAM)"
    )
    namespace: str = Field("roll", description="Ray namespace the run's actors are created in")
    init_timeout_s: float = Field(
        60.0,
        gt=0,
        description="seconds to wait for the roles' placement groups before failing with what is missing",
    )
    call_timeout_s: float = Field(600.0, gt=0, description="default timeout of every remote call")


class RoleConfig(RollModel):
    """Where a role's workers run. Roles that name the same ``device_group`` share devices (colocated)."""

    num_workers: int = Field(1, ge=1, description="Ray actors (ranks) of this role")
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs Ray reserves per worker (fractions allowed)")
    gpus_per_worker: float = Field(0.0, ge=0, description="GPUs Ray reserves per worker; 0 on CPU")
    device_group: str | None = Field(
        None,
        description="roles naming the same group share its devices (colocated, time-shared); unset: its own",
    )
    call_timeout_s: float | None = Field(None, gt=0, description="overrides ray.call_timeout_s for this role")
    node: str | None = Field(
        None,
        min_length=1,
        description="pin the role to nodes offering this Ray resource: a label given with `ray start "
        "--resources='{\"trainer\": 1}'` (or a KubeRay group's rayStartParams), or `node:<ip>`; roles of one "
        "device_group must agree",
    )


DEFAULT_STDOUT_METRICS: tuple[str, ...] = (
    "reward/mean",
    "reward/accuracy",
    "env/return",
    "env/success_rate",
    "actor/loss",
    "train/loss",
    "train/reward_mean",
    "eval/accuracy",
    "eval/answer_accuracy",
    "eval/loss",
    "eval/success_rate",
    "time/step_s",
    "accuracy",  # roll eval (rlvr_rollout): its summary's names are bare
    "pass@*",
    "warmup/loss",
)
"""The stdout line's metrics when ``tracking.stdout_metrics`` is not set: the few names that say whether a run
learns, in every mode (a mode has at most seven of them)."""


class TrackingConfig(RollModel):
    """Where metrics go. Names are entry points of the ``roll.tracker`` group."""

    backends: list[str] = Field(
        default_factory=lambda: ["stdout", "jsonl", "tensorboard"],
        description="roll.tracker entry points that receive every logged metric (see trackers)",
    )
    log_every: int = Field(1, ge=1, description="log the metrics of every Nth step (and always the last)")
    stdout_metrics: list[str] = Field(
        default_factory=lambda: list(DEFAULT_STDOUT_METRICS),
        description="fnmatch patterns of the metrics the stdout line shows (files always get all of them); "
        'the default is a short set covering every mode (reward, accuracy, loss, eval, step time); ["*"] shows all',
    )
    project: str = Field("roll", description="project/experiment name for wandb, mlflow, swanlab and trackio")
    progress: bool = Field(
        True,
        description="a progress line (step/total, elapsed, ETA) on stderr when stderr is a terminal; "
        "nothing extra otherwise (the stdout line already says step n/total)",
    )
    log_samples_every: int = Field(
        10,
        ge=0,
        description="write a few samples of a step (prompt, response, reward, ground truth) to samples.jsonl and "
        "each tracker's text/table form at step 1 and every this many steps, plus a few greedy answers at each "
        "evaluation; 0 turns samples off",
    )
    log_samples_count: int = Field(4, ge=1, description="samples per logged step (spread over the batch)")


class CheckpointConfig(RollModel):
    """Checkpoint cadence. ``every_n_steps=0`` saves only at the end of the run."""

    every_n_steps: int = Field(0, ge=0, description="save every N steps; 0: only at the end of the run")
    keep_last: int = Field(
        3, ge=1, description="complete checkpoints kept; older ones are deleted after a save"
    )
    dir: Path | None = Field(None, description="default: <output_dir>/checkpoints")
    export_hf: bool = Field(
        False,
        description="at the end, also export the trained model under output_dir: a save_pretrained folder hf/ "
        "(reward_fl: diffusers/ or lora/)",
    )


class FailureConfig(RollModel):
    """When a run that cannot learn stops, non-zero, with one message naming the cause (the rules and the reasons
    for these defaults: :mod:`roll.core.failures`). A healthy run has no failed reward or env calls, finite losses
    and an update every step, so it never meets them."""

    max_error_rate: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="stop when the share of rows (episodes) whose reward or env failed, averaged over "
        "error_window steps, exceeds this; 1 never stops",
    )
    error_window: int = Field(5, ge=1, description="steps the error rate is averaged over")
    non_finite: Literal["stop", "skip"] = Field(
        "stop",
        description="a NaN/inf loss or gradient norm: stop the run (default), or skip that update and go on",
    )
    max_steps_without_update: int = Field(
        10,
        ge=0,
        description="stop after this many steps in a row without a useful optimizer update (nothing trained, "
        "every advantage zero, or a skipped non-finite update); 0 never stops",
    )


class RunConfig(RollModel):
    """The keys every run has. ``pipeline`` names an entry point of the ``roll.pipeline`` group."""

    pipeline: str = Field(description="the training mode: an entry point of the roll.pipeline group")
    seed: int = Field(
        42,
        description="the run's seed: prompt order, per-request sampling, shuffles (data.seed, model.seed are their own)",
    )
    output_dir: Path = Field(
        Path("outputs/run"), description="where metrics, checkpoints, samples and the resolved config go"
    )
    max_steps: int = Field(1, ge=1, description="training steps of the run (optimizer steps of the pipeline)")
    eval_every: int = Field(0, ge=0, description="0 disables evaluation")
    resume: Literal["auto", "never"] | Path = Field(
        "never",
        description="auto: continue the run in output_dir from its newest intact checkpoint; a path: from that "
        "checkpoint; never: start a new run (refused when output_dir already holds one, unless overwrite)",
    )
    overwrite: bool = Field(
        False,
        description="start afresh in an output_dir that holds a run: the old run is first moved aside to the "
        "sibling output_dir.old-YYYYmmdd-HHMMSS (never deleted)",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        description="restarts from the latest checkpoint after a worker process dies (0: fail at once)",
    )
    stop_grace_s: float = Field(
        10.0,
        ge=0,
        description="after a first SIGTERM/SIGINT, how long the current step may take to finish (it is then "
        "checkpointed); past it the step is abandoned and the last checkpoint kept (a stuck call must not hold "
        "a preempted run)",
    )
    ray: RayConfig = Field(default_factory=RayConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    failures: FailureConfig = Field(default_factory=FailureConfig)

    @classmethod
    def moved_keys(cls) -> dict[str, str]:
        """Keys an older layout of this config had, mapped to their new path; a config that still uses one gets
        the path as its hint instead of a bare 'unknown key'. Default: none."""
        return {}

    @classmethod
    def upgrade_saved(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A config this mode saved under an older layout (a run's ``config.yaml``, a checkpoint's
        ``run_config.yaml``), rewritten to the current one; ``roll export`` reads saved configs through it. A
        saved config was valid when written, so its moved keys are moved, not refused; a config a person passes
        is never upgraded (its moved keys get the new path as hint). Default: unchanged."""
        return data

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        error = moved_keys_error(data, cls.moved_keys())
        if error is not None:
            raise error
        return data

    @model_validator(mode="after")
    def _overwrite_or_resume(self) -> Self:
        if self.overwrite and self.resume == "auto":
            issue = ConfigIssue(
                "overwrite",
                "overwrite=true moves the run in output_dir aside, resume=auto continues it: they contradict",
                "keep one: resume=auto to continue the run, or overwrite=true to start afresh",
            )
            raise issues_error([issue])
        return self
