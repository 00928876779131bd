"""The co-evolution loop: a run's step sequence over the phases (:mod:`.phases`), with the lifecycle hooks.

A step runs each phase once (matchmaking, proposals, solving, grading, ratings, training, the problems kept), then
reports its metrics; every E steps selection and replacement with LoRA operators (:mod:`.evolution`); checkpoints
atomically (:mod:`.state`). The single-agent baseline is the same step with each adapter matched with itself.

Randomness is derived per (seed, step, phase) (:mod:`.rng`), so a resumed run draws exactly what an uninterrupted
one would.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ..api.components import BaseModel
from ..api.errors import RecipeError, UserError
from ..api.population import Population
from ..api.runview import RunView
from ..api.schema import Recipe
from ..plugin.manager import PluginManager
from ..services.probe import OUTCOMES
from ..services.runtime import apply_threads
from . import evolution, phases, state
from .assembly import build_components
from .devices import check_devices
from .metrics import PhaseTimer, step_metrics
from .probe import evaluate as evaluate_probe
from .probe import run_probe_set
from .provenance import missing_plugin, record_sources
from .run_dir import RunDir
from .stop import StopRequested, StopSignals


class Run:
    """A live run: its components, population and run directory, and the step sequence over the phases.

    Hooks receive its :meth:`view`, never the run itself."""

    def __init__(
        self,
        recipe: Recipe,
        run_dir: RunDir,
        manager: PluginManager,
        *,
        base_model: BaseModel | None = None,
        resume_step: int = 0,
    ) -> None:
        self.recipe, self.dir, self.hook = recipe, run_dir, manager.hook
        self.resume_step = resume_step  # the checkpoint a resumed run continues from (0: a new run)
        self.components = build_components(recipe, run_dir, manager, base_model=base_model, resume_step=resume_step)
        self.population = Population.create(
            recipe.population.teachers,
            recipe.population.students,
            shared=recipe.population.single_agent,
            prior=self.components.matchmaker.prior(),
        )
        self.step = 0
        self.sources = ""  # the run.log line naming each component's plugin, package and version
        self.coverage: dict[str, set[str]] = defaultdict(set)
        self.evolution_deferred: int | None = None  # the last step, when its evolution was due but left out
        self._last_checkpoint_s = 0.0
        # a stop signal (:mod:`.stop`): the step in progress may be ended until it trains; what it ends on is the
        # snapshot of the complete step before it, the checkpoint a stop writes
        self.abortable = False
        self.last_complete: state.Snapshot | None = None
        self.checkpointed_step = 0  # the step of the newest checkpoint this process wrote or restored
        self._step_began: float | None = None
        self.in_step: int | None = None  # the step in progress (None between steps)
        self._step_s: float | None = None  # the last step's duration in this process (a stop's grace estimate)

    def view(self) -> RunView:
        """What hooks receive (:class:`RunView`): the recipe, run directory, steps done, a population copy, emit."""
        return RunView(
            self.recipe, self.dir.path, self.step, Population.from_dict(self.population.to_dict()), self.emit
        )

    def emit(self, records: list[dict[str, Any]]) -> None:
        self.dir.append("events.jsonl", records)
        for sink in self.components.sinks:
            for record in records:
                sink.emit(record)

    def initialise(self) -> None:
        """Fresh adapters (version 0) for every member, then the seed buffers."""
        evolution.initialise(self.components, self.population)
        counts = state.load_seed_problems(self.components)
        if counts is not None:
            self.emit([{"event": "seeds", "step": 0, "file": self.recipe.seeds.file, **counts}])

    def restore(self) -> None:
        """Continue from the latest complete checkpoint."""
        self.step, self.population, self.coverage, self.evolution_deferred = state.restore(self.components)
        self.checkpointed_step = self.step

    def step_time_left(self) -> float | None:
        """The step in progress's time left, by the last step's duration in this process (None: no estimate)."""
        if self._step_s is None or self._step_began is None:
            return None
        return max(0.0, self._step_s - (time.perf_counter() - self._step_began))

    def run_step(self) -> dict[str, Any]:
        """One step: each phase once, in order, with the lifecycle hooks between; returns the step's metrics."""
        c, pop = self.components, self.population
        if self.evolution_deferred == self.step:  # `populora resume RUN steps=N`: what a longer run did here
            self._evolve(self.step)
        self.evolution_deferred = None
        self.last_complete = state.snapshot(c, self.step, pop, self.coverage, None)
        step, timer, step_start = self.step + 1, PhaseTimer(), time.perf_counter()
        self._step_began, self.in_step = step_start, step
        self.abortable = True  # until it trains, a stop ends this step and keeps the one before (last_complete)
        self.hook.on_step_start(run=self.view(), step=step)
        with timer("matchmaking"):
            matches = phases.match(c, pop, step)
            self.hook.after_matchmaking(run=self.view(), step=step, matches=matches)
            phases.check_hooked_matches(matches, pop, self.hook.after_matchmaking)
        proposals, dropped = phases.propose(c, pop, step, timer)
        solved = phases.solve_proposals(c, pop, proposals, matches, step, timer)
        own_rates = (
            None
            if self.recipe.population.cross_evaluation
            else phases.solve_own_proposals(c, pop, proposals, step, timer)
        )
        with timer("grade"):
            rollouts = phases.grade(c, pop, proposals, matches, solved, own_rates)
        buffered = phases.solve_buffer(c, pop, step, timer)
        rollouts += [r for answers in buffered.answers for r in answers]
        for member_id, signature in solved.covered + buffered.covered:
            self.coverage[member_id].add(signature)
        with timer("ratings"):
            outcomes = phases.rate(c, pop, matches, proposals)
        self.hook.after_rewards(run=self.view(), step=step, rollouts=rollouts)
        self.abortable = False  # training changes the trainer's state: from here the step finishes
        with timer("train"):
            c.engine.sleep()
            train_stats = phases.train(c, pop, rollouts)
        with timer("buffers"):
            phases.keep_problems(c, proposals, matches, step)
        self.step = step
        metrics = step_metrics(step, pop, self.coverage, c.tasks, matches, outcomes, proposals, rollouts, train_stats)
        dropped += solved.dropped + buffered.dropped
        metrics.update({f"rollout/dropped/{reason}": n for reason, n in sorted(dropped.items())})
        events = []
        every = self.recipe.evolution.every
        if every and step % every == 0 and not self.recipe.population.single_agent:
            if step < self.recipe.steps:
                with timer("evolution"):
                    events = self._evolve(step)
            else:  # a last-step child would never train; a run extended past this step replays it first
                self.evolution_deferred = step
        timer.seconds["checkpoint"] += self._last_checkpoint_s  # the previous step's, paid between steps
        metrics.update(timer.metrics(time.perf_counter() - step_start + self._last_checkpoint_s, len(events)))
        self.emit([{"event": "step", **metrics}])
        self.hook.on_step_end(run=self.view(), step=step, metrics=metrics)
        probe = self.recipe.probe
        if probe.enabled and (step == self.recipe.steps or (probe.every and step % probe.every == 0)):
            self.probe(step, include_base=False)
        self._last_checkpoint_s = 0.0
        if step % self.recipe.checkpoint.every == 0 or step == self.recipe.steps:
            start = time.perf_counter()
            self.checkpoint()
            self._last_checkpoint_s = time.perf_counter() - start
        self._step_s = time.perf_counter() - step_start
        self.in_step = None
        return metrics

    def _evolve(self, step: int) -> list[dict[str, Any]]:
        """Selection and replacement per sub-population, between the evolution hooks; returns the lineage records."""
        view = self.view()  # observers see a copy: selection reads the run's own population
        self.hook.before_evolution(run=view, step=step, population=view.population)
        events = evolution.evolve(self.components, self.population, step)
        self.dir.append("lineage.jsonl", events)
        self.emit([{"event": "evolution", **e} for e in events])
        self.hook.after_evolution(run=self.view(), step=step, events=events)
        return events

    def checkpoint(self) -> None:
        """A complete checkpoint of this step, then the adapter versions ``adapters.keep`` lets go."""
        snap = state.snapshot(self.components, self.step, self.population, self.coverage, self.evolution_deferred)
        self._write_checkpoint(snap)

    def _write_checkpoint(self, snap: state.Snapshot) -> None:
        path = state.write_snapshot(self.components, snap)
        self.checkpointed_step = snap.step
        self.hook.on_checkpoint(run=self.view(), step=snap.step, path=str(path))
        state.prune_adapters(self.dir, snap.population, self.recipe.adapters)

    def keep_newest_step(self, stop: StopRequested) -> None:
        """On a stop signal: a checkpoint of the newest complete step unless one is on disk; what ``stop`` says.

        A step ended before it trained leaves the run as its :attr:`last_complete` snapshot recorded it (the step
        in progress's logs and adapters are rolled back by the resume); between steps the run is complete as it
        is. Step 0 (nothing trained yet) is never checkpointed: a resume starts such a run over."""
        self.abortable = False
        stop.in_step = self.in_step
        if self.in_step is not None:  # ended before it trained
            newest = self.last_complete
        elif self.step > self.checkpointed_step:
            newest = state.snapshot(self.components, self.step, self.population, self.coverage, self.evolution_deferred)
        else:
            newest = None
        if newest is not None and newest.step > self.checkpointed_step and newest.step > 0:
            self._write_checkpoint(newest)
        stop.checkpoint_step = self.checkpointed_step or None

    def probe(self, step: int, *, include_base: bool) -> list[dict[str, Any]]:
        """Solver accuracy per task type of every student (and the base), appended to probe.jsonl."""
        records = evaluate_probe(self.components, self.population.students, step, include_base=include_base)
        self.dir.append("probe.jsonl", records)
        # observers get the accuracies; the per-problem outcomes stay in probe.jsonl only
        self.emit([{"event": "probe", **{k: v for k, v in r.items() if k not in OUTCOMES}} for r in records])
        return records

    def close(self) -> None:
        try:
            self.components.close()
        finally:
            self.dir.unlock()


def start_run(
    recipe: Recipe, resolved: dict[str, Any], run_dir: RunDir, manager: PluginManager, *, recipe_file: str = "recipe"
) -> Run:
    """A new run in ``run_dir``, initialised and ready for :func:`execute`.

    The recipe's ``runtime.threads`` is applied first (:func:`populora_core.services.runtime.apply_threads`), for
    this process and the processes the run starts, whoever calls it; ``runtime.cpu_isa`` must be in place before
    torch loads, which is the caller's (the ``populora`` command sets it before importing torch).
    """
    apply_threads(recipe.runtime)
    base = manager.registry.base_model(recipe.base_model.name, recipe.base_model.params)  # missing: no run dir
    check_start(recipe, recipe_file)  # every file the recipe names, before a run directory exists
    device_warning = check_devices(recipe, manager.registry)  # GPUs torch cannot use: an error if it asks for one
    run_dir.create(resolved)  # made and locked in one claim: a start racing it is refused, having written nothing
    if device_warning:
        _warn(run_dir, device_warning)
    run: Run | None = None
    try:
        run = Run(recipe, run_dir, manager, base_model=base)
        if recipe.probe.enabled:  # read and checked now (counts per task type, records that fit the tasks)
            run_probe_set(run.components)
        run.initialise()
        run.sources = record_sources(recipe, run_dir, manager)
    except BaseException:
        try:
            if run is not None:
                run.components.close()
        finally:  # a run that never started (no cluster, a bad component or --init-from) leaves nothing
            run_dir.discard_new()
        raise
    return run


def _warn(run_dir: RunDir, text: str) -> None:
    """A warning on the terminal (the command line prints warnings) and in run.log."""
    run_dir.log_line(f"warning: {text}")
    warnings.warn(text, stacklevel=3)


def check_start(recipe: Recipe, recipe_file: str = "recipe") -> None:
    """What a start needs besides its components, checked before a run directory exists: every file the recipe
    names (:func:`populora_core.recipe.validate.check_files`) and adapters for each role in ``init_from``."""
    from ..recipe.validate import check_files

    check_files(recipe, recipe_file)
    if recipe.population.init_from:
        members = Population.create(
            recipe.population.teachers, recipe.population.students, shared=recipe.population.single_agent
        ).members
        evolution.init_sources(recipe.population.init_from, list(members.values()))


def check_resume_overrides(overrides: tuple[str, ...]) -> None:
    for item in overrides:
        key = item.split("=", 1)[0]
        if not (key.startswith("cluster") or key == "steps"):
            raise UserError(
                f"resume override {item!r}: only the cluster section and steps may change when a run resumes"
            )


def check_resume_steps(steps: int, done: int) -> None:
    """``steps=N`` may extend a run, never shorten it below the steps it has checkpointed."""
    if steps < done:
        raise UserError(f"steps={steps}: the run has already done {done} steps; extend it, never shorten it")


def resume_run(run_dir: RunDir, manager: PluginManager, overrides: tuple[str, ...] = ()) -> Run:
    """The run from its newest intact checkpoint; one that provably never completed one starts over from step 0,
    a damaged one without an intact checkpoint is refused with nothing changed.

    ``overrides`` may move the run to other hardware (``cluster.name=ray``, ``cluster.params.workers=1``): where
    the components run never changes what a run computes. ``steps=N`` extends the run to N steps: the steps
    after its last are what a run planned for N steps from the start computes (adapters, lineage, problems),
    the last step's evolution included, which a run leaves out at its final step. Nothing else may change; the
    new values are written to the run's recipe once the run is built. The recipe's ``runtime.threads`` is
    applied as :func:`start_run` applies it.
    """
    from ..recipe.overrides import apply_overrides
    from ..recipe.validate import parse_recipe
    from .recovery import recipe_for_resume, resume_point, start_over

    recipe_file = str(run_dir.path / "recipe.yaml")
    check_resume_overrides(overrides)
    point = resume_point(run_dir)
    data = apply_overrides(recipe_for_resume(run_dir), overrides, recipe=recipe_file)
    try:
        recipe = parse_recipe(data, manager.registry, recipe=recipe_file)
    except RecipeError as exc:  # a component no installed plugin registers now: name what supplied it
        raise missing_plugin(exc, run_dir) from None
    done = point.step
    check_resume_steps(recipe.steps, done)
    apply_threads(recipe.runtime)  # as start_run: the recorded recipe's thread count, whoever resumes it
    device_warning = check_devices(recipe, manager.registry)
    run_dir.check_space()  # a disk that cannot hold a checkpoint like the newest: said now, not after a step
    run_dir.lock()
    run: Run | None = None
    try:
        run = Run(recipe, run_dir, manager, resume_step=done)
        if device_warning:
            _warn(run_dir, device_warning)
        if point.checkpoint is None:  # it never completed a checkpoint: what it wrote is a start to redo
            start_over(run_dir)
            run.initialise()
        else:
            run.restore()  # reads every component's state before changing anything: a refusal leaves the run as it was
        if overrides:
            run_dir.write_recipe(recipe.model_dump(mode="json"))
        run.sources = record_sources(recipe, run_dir, manager)
    except BaseException:  # a refused resume lets the run go: this process may go on (a notebook, a driver)
        if run is not None:
            run.close()
        else:
            run_dir.unlock()
        raise
    return run


def execute(
    run: Run,
    *,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    on_probe: Callable[[], None] | None = None,
    on_steps_done: Callable[[], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> None:
    """Run steps until the recipe's ``steps`` with the run hooks around them; the callbacks are for displays
    (``on_steps_done``: the steps are over, before ``on_run_end`` observers print their summaries; ``note``: what a
    stop signal does, as it happens, besides ``RUN/run.log``).

    SIGTERM or SIGUSR1 (:mod:`.stop`) ends the run with a checkpoint of its newest complete step and raises
    :class:`StopRequested` saying which; hooks see the status ``"interrupted"``, as for Ctrl-C."""

    def say(text: str) -> None:
        run.dir.log_line(text)
        (note or _to_stderr)(text)

    run.hook.on_run_start(run=run.view())
    status = "failed"
    stops = StopSignals(run, run.recipe.checkpoint.stop_grace_s, say)
    try:
        with stops:
            if run.recipe.probe.enabled and run.step == 0:
                if on_probe is not None:
                    on_probe()
                run.abortable = True  # nothing to keep yet: a stop ends the probe
                run.probe(0, include_base=True)
                run.abortable = False
            while run.step < run.recipe.steps:
                stops.check()
                metrics = run.run_step()
                if on_step is not None:
                    on_step(metrics)
            status = "completed"  # a stop that came in the last step: the run is complete
    except StopRequested as stop:
        status = "interrupted"
        stop.finished_step = stops.finishing and stop.in_step is None
        with stops:  # a second signal while the checkpoint is written exits at once
            stops.requested = stop.signal_name
            run.keep_newest_step(stop)
        raise
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        try:
            if on_steps_done is not None:
                on_steps_done()
            run.hook.on_run_end(run=run.view(), status=status)
        finally:
            run.close()


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
