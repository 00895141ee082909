"""The run loop every training mode shares: :class:`Run`, which holds a recipe, and :class:`RunHost`, its services.

A recipe (:class:`~roll.core.types.Recipe`, a plain class per mode) says *what* a step is; :class:`Run` owns
*when*: Ray start, resource placement, resume, the step loop with evaluation and checkpoint cadence, tracking, a
clean shutdown of every actor on success, error, Ctrl-C or SIGTERM, a checkpoint before exiting on a preemption
signal, and recovery from a lost worker (see :mod:`roll.core.recovery`). ``Run`` is final: a mode composes it,
never subclasses it; the loop in :meth:`Run.run` reads top to bottom as named steps. What a recipe borrows from
the run (making clusters, the tracker, samples, the failure guard, output dir, seed, current step) comes through
one :class:`RunHost`, handed to the recipe when it is built.

Optional phases are declared, not probed: :meth:`Recipe.phases <roll.core.types.Recipe.phases>` returns a
:class:`~roll.core.types.Phases` whose unset members the run skips (a recipe without ``evaluate`` logs no
``eval/`` metrics; one without ``export`` warns when ``checkpoint.export_hf`` is set).

Stop conditions: after every step its metrics go to :class:`~roll.core.failures.FailureGuard`, which raises
:class:`~roll.core.failures.RunStopped` for a run that cannot learn (error rates of user code, a non-finite loss
or gradient, steps without updates); recipes hand it the error reports of their user-code calls to show.

The output dir is claimed and the checkpoint to resume from verified when the run is built, before Ray starts
(:mod:`roll.core.rundir`): a new run never appends to or overwrites another, and a damaged checkpoint is never
loaded.

Phases of :meth:`Run.run`: ``setup`` -> resume -> ``warm_up`` (a fresh run only) -> the step loop -> the final
checkpoint and export -> ``report``.

Step numbering: :attr:`Run.step` (``host.step``) is the number of completed training steps. ``train_step(step)``
receives the index of the step it runs (0-based), so after it returns ``step == step + 1``; a checkpoint named
``step_000004`` holds the state after four completed steps, and a resumed run continues with ``train_step(4)``.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, final

from roll.core import plugins, rundir
from roll.core.checkpoint import CheckpointManager, PipelineState, read_manifest, restore_rng_state
from roll.core.cluster import Cluster, RayHandle, ResourceManager, Worker, WorkerRef, init_ray, shutdown_ray
from roll.core.config.loader import dump_yaml
from roll.core.config.sections import RunConfig
from roll.core.errors import ConfigError
from roll.core.export import RUN_CONFIG
from roll.core.failures import FailureGuard, RunStopped
from roll.core.recovery import LostWorker, Preempted, StopSignals, find_lost_worker
from roll.core.samples import SampleLog, SampleRow
from roll.core.startup import tracker_issues
from roll.core.summary import RunSummary, pick_metrics
from roll.core.tracking import MultiTracker, Progress
from roll.core.types import Phases, Recipe, Tracker

logger = logging.getLogger(__name__)

RecipeFactory = Callable[["RunHost"], Recipe]
"""``recipe(host) -> Recipe``: builds a mode's recipe once the run's services exist (usually a lambda that
closes over the config: ``lambda host: SFTRecipe(config, host)``)."""


@final
class Run:
    """One training run: a recipe and the services around it. See the module docstring for the contract.

    Built by a mode's :attr:`PipelineSpec.build <roll.core.types.PipelineSpec.build>` as
    ``Run(config, name=..., recipe=...)``; implements :class:`~roll.core.types.Pipeline` for ``roll train``."""

    def __init__(self, config: RunConfig, *, name: str, recipe: RecipeFactory) -> None:
        self.config = config
        self.name = name
        self.output_dir = Path(config.output_dir)
        self.step = 0
        root = config.checkpoint.dir or self.output_dir / "checkpoints"
        rundir.claim(config, root)  # refuses a dir that holds another run, or moves it aside (overwrite)
        self.checkpoints = CheckpointManager(root, config.checkpoint.keep_last, pipeline_name=name)
        self.run_start = rundir.plan(config, self.checkpoints, name)  # verified before any worker exists
        self.tracker: Tracker = (
            MultiTracker([]) if self.run_start.finished else build_trackers(config, self.output_dir)
        )
        self.samples = SampleLog(
            self.output_dir,
            self.tracker,
            every=0 if self.run_start.finished else config.tracking.log_samples_every,
            count=config.tracking.log_samples_count,
        )
        """A few rows of a step and of each evaluation for a person to read (:mod:`roll.core.samples`); recipes
        hand them over with :meth:`RunHost.log_train_samples` and :meth:`RunHost.log_eval_samples`."""
        self.summary = RunSummary(config.tracking.stdout_metrics)
        """What the run did, for the closing lines (:meth:`summary_lines`)."""
        self.failures = FailureGuard(config.failures)
        """Shows user-code errors once and stops a run that cannot learn (:mod:`roll.core.failures`); a step's
        metrics are checked after they are logged, so the step that tripped a limit is in the records."""
        self.ray: RayHandle | None = None
        self.resources: ResourceManager | None = None
        self.clusters: list[Cluster] = []
        self.last_metrics: dict[str, float] = {}
        self.restarts = 0
        self._restart_from: Path | None = None
        self._saved_step: int | None = None
        self._closed = False
        self._owns_ray = False
        self.host = RunHost(self)
        self.recipe = recipe(self.host)
        self.phases: Phases = self.recipe.phases()
        self._carried: dict[str, float] = {}  # metrics of a phase before a step, logged with that step

    # ------------------------------------------------------------------------------------------ report

    def summary_lines(self) -> list[str]:
        """The closing lines of a finished run (:class:`~roll.core.summary.RunSummary`)."""
        return self.summary.lines(
            name=self.name, step=self.step, max_steps=self.config.max_steps, last=self.last_metrics,
            output_dir=self.output_dir, checkpoint=self.checkpoints.latest(),
        )  # fmt: skip

    # ---------------------------------------------------------------------------------------------- run

    def run(self) -> dict[str, float]:
        """Train until ``max_steps``; returns the last step's metrics. Always call :meth:`shutdown` after.

        First says on stderr what the run continues from (:meth:`roll.core.rundir.RunStart.describe`); a run
        whose checkpoint is already at ``max_steps`` returns ``{}`` there, before Ray starts. Otherwise the next
        line is ``roll: run dir <absolute output_dir>``; :meth:`summary_lines` are the closing lines.
        Raises :class:`~roll.core.recovery.Preempted` after a graceful stop on SIGTERM/SIGINT (a checkpoint was
        written), ``KeyboardInterrupt`` when a step was abandoned. A lost worker is recovered from up to
        ``max_restarts`` times (see :mod:`roll.core.recovery`). The recipe's ``report`` phase runs at the end,
        whatever the outcome.
        """
        try:
            print(f"roll: {self.run_start.describe(self.name)}", file=sys.stderr, flush=True)
            if self.run_start.finished:
                return {}
            print(f"roll: run dir {self.output_dir.resolve()}", file=sys.stderr, flush=True)
            self.summary.start(self.run_start.step)
            stop = StopSignals(grace_s=self.config.stop_grace_s)
            with stop.installed():
                try:
                    self._start_runtime()
                    stop.reinstall()
                    while not self._attempt(stop):
                        pass
                except KeyboardInterrupt as exc:
                    # Ray may have dropped the message: the reason is kept in `stop`.
                    raise KeyboardInterrupt(self._interrupted(stop, exc)) from None
                self.failures.finish(self.step)
                self._final_checkpoint()
                if self.config.checkpoint.export_hf:
                    self._export()
            return dict(self.last_metrics)
        finally:
            if self.phases.report is not None:
                _quietly(self.phases.report, "writing the run's report")

    def _export(self) -> None:
        if self.phases.export is None:
            logger.warning("%s: checkpoint.export_hf is set, but this pipeline has no HF export", self.name)
            return
        self.phases.export(self.output_dir)

    def _interrupted(self, stop: StopSignals, exc: KeyboardInterrupt) -> str:
        reason = stop.reason or str(exc) or f"interrupted during step {self.step + 1} (Ctrl-C)"
        latest = self.checkpoints.latest()
        return f"{reason}; last checkpoint: {latest or 'none yet'}"

    def _attempt(self, stop: StopSignals) -> bool:
        """Set up, resume and run the step loop once; ``False`` when a lost worker was recovered from."""
        try:
            self.recipe.setup()
            self._resume()
            self._write_config()
            if self.step == 0:
                self._warm_up()
            self._loop(stop)
        except Preempted:
            raise
        except Exception as exc:
            lost = find_lost_worker(self.clusters) if self.clusters else None
            if lost is None:
                raise
            if stop.requested:
                raise KeyboardInterrupt(f"stopping on a signal; {lost}") from exc
            self._recover(lost, exc)
            return False
        return True

    def _warm_up(self) -> None:
        start = time.perf_counter()
        if self.phases.warm_up is not None and self.phases.warm_up():
            seconds = time.perf_counter() - start
            print(f"roll: {self.name}: warm-up done in {seconds:.1f} s", file=sys.stderr, flush=True)
            # into the first step's row: a row of its own would be a second line for step 0, where a warm-up
            # may already have logged its held-out evaluation
            self._carried["time/warmup_s"] = seconds

    def _loop(self, stop: StopSignals) -> None:
        with Progress(
            self.config.max_steps, initial=self.step, desc=self.name, enabled=self.config.tracking.progress
        ) as progress:
            stop.armed = True
            try:
                while self.step < self.config.max_steps:
                    stop.step = self.step
                    self._one_step(progress)
                    stop.step = self.step
                    if stop.requested:
                        stop.step_finished()
                        self._preempt(stop)
            finally:
                stop.armed = False
                stop.step_finished()

    def _preempt(self, stop: StopSignals) -> None:
        self._final_checkpoint()
        latest = self.checkpoints.latest()
        name = signal.Signals(stop.signum or signal.SIGTERM).name
        raise Preempted(
            f"{name}: stopped after step {self.step} of {self.config.max_steps}, checkpoint {latest}. "
            "Continue exactly with the same command plus resume=auto",
            step=self.step,
            checkpoint=str(latest),
            signal=name,
        )

    def _recover(self, lost: LostWorker, exc: Exception) -> None:
        """Tear down every cluster, free and re-reserve the resources; the next attempt resumes from the latest
        checkpoint (or from the start). Re-raises ``exc`` once ``max_restarts`` restarts are spent."""
        limit = self.config.max_restarts
        if self.restarts >= limit:
            logger.error("%s: %s; giving up after %d restarts (max_restarts)", self.name, lost, self.restarts)
            raise exc
        self.restarts += 1
        latest = self.checkpoints.latest_intact()
        logger.error(
            "%s: %s (the step failed with %s: %s). Restart %d of %d: rebuilding the clusters, resuming from %s",
            self.name, lost, type(exc).__name__, str(exc).splitlines()[0][:300], self.restarts, limit,
            latest or "the start",
        )  # fmt: skip
        for cluster in reversed(self.clusters):
            _quietly(cluster.shutdown, f"shutting down {cluster.role}")
        self.clusters = []
        if self.phases.teardown is not None:
            self.phases.teardown()
        if self.resources is not None:
            self.resources.release()
            self.resources.allocate()
        self._restart_from = latest
        self._rewind_tracker(read_manifest(latest).step if latest else self.run_start.step)
        self.step = 0

    def _rewind_tracker(self, last_step: int) -> None:
        """The steps past ``last_step`` run again after a restart: their lines go, so each step is logged once."""
        rewind = getattr(self.tracker, "rewind", None)
        if rewind is not None:
            rewind(last_step)
        self.samples.rewind(last_step)

    def _start_runtime(self) -> None:
        import ray

        # Stop Ray at shutdown only if this pipeline started it (not a test fixture's or the caller's Ray).
        self._owns_ray = not ray.is_initialized()
        self.ray = init_ray(self.config.ray)
        self.resources = ResourceManager(self.recipe.roles(), timeout_s=self.config.ray.init_timeout_s)
        self.resources.allocate()  # raises with the arithmetic when the roles don't fit

    def _resume(self) -> None:
        start = self.run_start.checkpoint
        path = self._restart_from or (start.path if start else None)
        if path is None:
            return
        self.recipe.load_files(path)
        state = PipelineState.from_dict(self.checkpoints.load_state(path))
        self.recipe.load_state(state.data)
        restore_rng_state(state.rng)
        self.step = state.step
        logger.info("%s: resumed at step %d from %s", self.name, self.step, path)

    def _one_step(self, progress: Progress) -> None:
        start = time.perf_counter()
        metrics = dict(self.recipe.train_step(self.step))
        metrics.update(self._carried)
        self._carried = {}
        self.step += 1
        metrics["time/step_s"] = time.perf_counter() - start
        self.summary.observe_step(metrics["time/step_s"])
        if self.restarts:
            metrics["restarts"] = float(self.restarts)
        evaluate = self.phases.evaluate
        if evaluate is not None and self.config.eval_every and self.step % self.config.eval_every == 0:
            evaluated = {f"eval/{k}": v for k, v in evaluate(self.step).items()}
            self.summary.observe_eval(self.step, evaluated)
            metrics.update(evaluated)
        logged = self.step % self.config.tracking.log_every == 0 or self.step == self.config.max_steps
        if logged:
            self.tracker.log(metrics, self.step)
        self.last_metrics = metrics
        shown = pick_metrics(metrics, self.config.tracking.stdout_metrics, 4)
        progress.update(self.step, {k: metrics[k] for k in shown if not k.startswith("time/")})
        try:
            self.failures.observe(self.step, metrics)
        except RunStopped:
            if not logged:  # the step that stopped the run belongs in the records
                self.tracker.log(metrics, self.step)
            raise
        every = self.config.checkpoint.every_n_steps
        if every and self.step % every == 0:
            self.save_checkpoint()

    def _final_checkpoint(self) -> None:
        """Save the current step unless this run just did (a checkpoint of that step from an earlier run, or an
        abandoned timeline of an explicit resume, is not this state)."""
        if self._saved_step != self.step:
            self.save_checkpoint()

    def save_checkpoint(self) -> Path:
        """Save models, optimizer and pipeline state (step, data position, RNG) atomically."""
        state = PipelineState.capture(self.step, data=self.recipe.state())
        path = self.checkpoints.save(self.step, self._write_checkpoint_files, state)
        self._saved_step = self.step
        return path

    def _write_checkpoint_files(self, directory: Path) -> None:
        """The mode's files, and the run config beside them, so that one checkpoint dir says which model,
        tokenizer and adapter its weights belong to (``roll export`` reads it)."""
        self.recipe.save_files(directory)
        (directory / RUN_CONFIG).write_text(dump_yaml(self.config), encoding="utf-8")

    def _write_config(self) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / "config.yaml").write_text(dump_yaml(self.config), encoding="utf-8")

    # ----------------------------------------------------------------------------------------- shutdown

    def shutdown(self) -> None:
        """Tear the recipe down, stop every actor, free the placement groups, close trackers, stop Ray if we
        started it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.phases.teardown is not None:
            _quietly(self.phases.teardown, f"tearing {self.name} down")
        for cluster in reversed(self.clusters):
            _quietly(cluster.shutdown, f"shutting down {cluster.role}")
        if self.resources is not None:
            _quietly(self.resources.release, "releasing placement groups")
        _quietly(self._log_plots, "logging plots")
        _quietly(self.samples.close, "closing samples.jsonl")
        _quietly(self.tracker.close, "closing trackers")
        if self.ray is not None and self._owns_ray and self.ray.started_here:
            _quietly(shutdown_ray, "stopping Ray")

    def _log_plots(self) -> None:
        """The PNG plots a run wrote in its output folder, to the trackers that log images."""
        log_images = getattr(self.tracker, "log_images", None)
        plots = {path.stem: path for path in sorted(self.output_dir.glob("*.png"))}
        if log_images is not None and plots:
            log_images(plots, self.step)


@final
class RunHost:
    """What a recipe borrows from the :class:`Run` that holds it, and no more: clusters on the resources
    reserved for its roles, the tracker, the sample log, the failure guard, the output dir, the seed and the
    current step. Each is looked up at the call, as a restart after a lost worker replaces the clusters."""

    def __init__(self, run: Run) -> None:
        self._run = run

    @property
    def output_dir(self) -> Path:
        """The run's folder."""
        return self._run.output_dir

    @property
    def seed(self) -> int:
        """The run's seed (``seed``)."""
        return self._run.config.seed

    @property
    def step(self) -> int:
        """Completed training steps (``train_step(step)`` runs with ``host.step == step``)."""
        return self._run.step

    @property
    def tracker(self) -> Tracker:
        """The run's trackers; ``tracker.log(metrics, step)`` for what a phase logs besides a step's metrics."""
        return self._run.tracker

    @property
    def samples(self) -> SampleLog:
        """The sample log (``samples.count``: rows to build); log rows with :meth:`log_train_samples` and
        :meth:`log_eval_samples`."""
        return self._run.samples

    @property
    def failures(self) -> FailureGuard:
        """Shows the error reports of user-code calls (``failures.show(errors)``) and stops a run that cannot
        learn."""
        return self._run.failures

    def make_cluster(self, role: str, worker_cls: type[Worker] | WorkerRef, **kwargs: Any) -> Cluster:
        """A :class:`Cluster` for ``role`` on the resources reserved for it; shut down with the run.

        Its actors are launched, not waited for (``wait=False``): the first call waits, so the roles a ``setup``
        makes start their imports in parallel."""
        run = self._run
        kwargs.setdefault("wait", False)
        if run.resources is None:
            raise RuntimeError(
                "make_cluster is called from the recipe's setup(), after Ray and resources are up"
            )
        role_cfg = run.recipe.roles()[role]
        timeout = run.ray.call_timeout_s if run.ray else run.config.ray.call_timeout_s
        # a role's short call deadline (a reward's) must not cut its workers' start-up (imports, model load)
        kwargs.setdefault("start_timeout_s", max(timeout, role_cfg.call_timeout_s or 0.0))
        cluster = Cluster(role, worker_cls, role_cfg, run.resources, call_timeout_s=timeout, **kwargs)
        run.clusters.append(cluster)
        return cluster

    def release_cluster(self, cluster: Cluster) -> None:
        """Forget ``cluster``, which its maker has shut down itself (its bundles go to the next role)."""
        self._run.clusters.remove(cluster)

    def train_samples_due(self) -> bool:
        """Whether the step now running (``train_step``'s) logs samples: step 1 and every
        ``tracking.log_samples_every``-th; a recipe checks this before it builds rows."""
        return self._run.samples.due(self.step + 1)

    def log_train_samples(self, rows: list[SampleRow]) -> None:
        """Sample rows of the step now running, logged under its step number (the one its metrics get)."""
        self._run.samples.log(rows, self.step + 1, "train")

    def log_eval_samples(self, rows: list[SampleRow]) -> None:
        """Sample rows of the evaluation now running (``evaluate``'s), logged under the step it follows, with
        ``kind: "eval"``; every evaluation logs them unless samples are off."""
        self._run.samples.log(rows, self.step, "eval")


def build_trackers(config: RunConfig, output_dir: Path) -> Tracker:
    """The trackers ``tracking.backends`` names, found through the ``roll.tracker`` plugin group."""
    issues = tracker_issues(config)  # the check roll validate runs too
    if issues:
        raise ConfigError(issues=issues)
    run_config = config.model_dump(mode="json")
    specs = [plugins.load("roll.tracker", name) for name in config.tracking.backends]
    return MultiTracker([spec.build(output_dir, config.tracking, run_config) for spec in specs])


def _quietly(fn: Any, what: str) -> None:
    try:
        fn()
    except Exception:  # shutdown continues past one failure, so every other actor is still stopped
        logger.warning("error while %s", what, exc_info=True)
