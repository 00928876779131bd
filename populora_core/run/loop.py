"""The co-evolution loop: a run's step sequence over the phases (:mod:`.phases`), with the lifecycle hooks.

A step runs each phase once (matchmaking, proposals, solving, grading, ratings, training, the problems kept),
then reports its metrics; every E steps selection and replacement with LoRA operators (:mod:`.evolution`);
checkpoints atomically (:mod:`.state`). The single-agent baseline is the same step with each adapter matched
with itself.

Randomness is derived per (seed, step, phase) (:mod:`.rng`), so a resumed run draws exactly what an
uninterrupted one would.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ..api.components import BaseModel
from ..api.errors import UserError
from ..api.population import Population
from ..api.probe import OUTCOMES
from ..api.runtime import apply_threads
from ..api.runview import RunView
from ..api.schema import Recipe
from ..plugin.manager import PluginManager
from . import evolution, phases, state
from .assembly import build_components
from .metrics import PhaseTimer, step_metrics
from .probe import evaluate as evaluate_probe
from .run_dir import RunDir


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
            recipe.population.teachers, recipe.population.students, shared=recipe.population.single_agent
        )
        self.step = 0
        self.coverage: dict[str, set[str]] = defaultdict(set)
        self.evolution_deferred: int | None = None  # the last step, when its evolution was due but left out
        self._last_checkpoint_s = 0.0

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

    def run_step(self) -> dict[str, Any]:
        """One step: each phase once, in order, with the lifecycle hooks between; returns the step's metrics."""
        c, pop = self.components, self.population
        if self.evolution_deferred == self.step:  # `populora resume RUN steps=N`: what a longer run did here
            self._evolve(self.step)
        self.evolution_deferred = None
        step, timer, step_start = self.step + 1, PhaseTimer(), time.perf_counter()
        self.hook.on_step_start(run=self.view(), step=step)
        with timer("matchmaking"):
            matches = phases.match(c, pop, step)
            self.hook.after_matchmaking(run=self.view(), step=step, matches=matches)
        proposals, dropped = phases.propose(c, pop, step, timer)
        solved = phases.solve_proposals(c, pop, proposals, matches, step, timer)
        with timer("grade"):
            rollouts = phases.grade(c, pop, proposals, matches, solved)
        buffered = phases.solve_buffer(c, pop, step, timer)
        rollouts += [r for answers in buffered.answers for r in answers]
        for member_id, signature in solved.covered + buffered.covered:
            self.coverage[member_id].add(signature)
        with timer("ratings"):
            outcomes = phases.rate(c, pop, matches, proposals)
        self.hook.after_rewards(run=self.view(), step=step, rollouts=rollouts)
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
        path = state.checkpoint(self.components, self.step, self.population, self.coverage, self.evolution_deferred)
        self.hook.on_checkpoint(run=self.view(), step=self.step, path=str(path))
        state.prune_adapters(self.dir, self.population, self.recipe.adapters)

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


def start_run(recipe: Recipe, resolved: dict[str, Any], run_dir: RunDir, manager: PluginManager) -> Run:
    """A new run in ``run_dir``, initialised and ready for :func:`execute`.

    The recipe's ``runtime.threads`` is applied first (:func:`populora_core.api.runtime.apply_threads`), for
    this process and the processes the run starts, whoever calls it; ``runtime.cpu_isa`` must be in place before
    torch loads, which is the caller's (the ``populora`` command sets it before importing torch).
    """
    apply_threads(recipe.runtime)
    base = manager.registry.base_model(recipe.base_model.name, recipe.base_model.params)  # missing: no run dir
    run_dir.create(resolved)
    run: Run | None = None
    try:
        run_dir.lock()
        run = Run(recipe, run_dir, manager, base_model=base)
        run.initialise()
    except BaseException:
        try:
            if run is not None:
                run.components.close()
        finally:  # a run that never started (no cluster, a bad component or --init-from) leaves nothing
            run_dir.discard_new()
        raise
    return run


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
    from .recovery import recipe_for_resume, resume_point

    recipe_file = str(run_dir.path / "recipe.yaml")
    check_resume_overrides(overrides)
    point = resume_point(run_dir)
    data = apply_overrides(recipe_for_resume(run_dir), overrides, recipe=recipe_file)
    recipe = parse_recipe(data, manager.registry, recipe=recipe_file)
    done = point.step
    check_resume_steps(recipe.steps, done)
    apply_threads(recipe.runtime)  # as start_run: the recorded recipe's thread count, whoever resumes it
    run_dir.lock()
    try:
        run = Run(recipe, run_dir, manager, resume_step=done)
    except BaseException:
        run_dir.unlock()
        raise
    if point.checkpoint is None:  # it never completed a checkpoint: what it wrote is a start to redo
        run_dir.clear()
        run.initialise()
    else:
        run.restore()  # reads every component's state before changing anything: a refusal leaves the run as it was
    if overrides:
        run_dir.write_recipe(recipe.model_dump(mode="json"))
    return run


def execute(
    run: Run,
    *,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    on_probe: Callable[[], None] | None = None,
    on_steps_done: Callable[[], None] | None = None,
) -> None:
    """Run steps until the recipe's ``steps`` with the run hooks around them; the callbacks are for displays
    (``on_steps_done``: the steps are over, before ``on_run_end`` observers print their summaries)."""
    run.hook.on_run_start(run=run.view())
    status = "failed"
    try:
        if run.recipe.probe.enabled and run.step == 0:
            if on_probe is not None:
                on_probe()
            run.probe(0, include_base=True)
        while run.step < run.recipe.steps:
            metrics = run.run_step()
            if on_step is not None:
                on_step(metrics)
        status = "completed"
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
