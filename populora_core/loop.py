"""The co-evolution loop: one step, stage by stage, through components and lifecycle hooks.

step: matchmaking -> teachers propose (every task type) -> validation in the executor -> matched
students solve n samples per valid problem -> rewards (students; teachers from their MATCHED
student's solve rate) -> rating updates -> one policy update per member -> metrics; every E steps
selection and replacement with LoRA operators (:mod:`.evolution`); checkpoints atomically. The
single-agent baseline is the same step with each adapter matched with itself.

Randomness is derived per (seed, step, phase) (:mod:`.rng`), so a resumed run draws exactly what an
uninterrupted one would.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from . import evolution, solving, state
from .components import (
    AdapterRef,
    BaseModel,
    Cluster,
    GenerationRequest,
    LoraSettings,
    Match,
    MatchOutcome,
    Problem,
    Rollout,
    SamplingParams,
    UpdateJob,
)
from .errors import UserError
from .metrics import PhaseTimer, problem_records, step_metrics
from .modelhost import refuse_idle_gpus
from .plugins import PluginManager
from .population import Member, Population
from .probe import ProbeTarget, probe_records, probe_set
from .problems import Proposal
from .recipe import LOCAL_CLUSTER, Recipe
from .registry import Component
from .rng import Streams
from .run import RunDir
from .runview import RunView


class Run:
    """A live run: recipe, components, population, run directory. Hooks receive its :meth:`view`."""

    def __init__(
        self,
        recipe: Recipe,
        run_dir: RunDir,
        manager: PluginManager,
        *,
        base_model: BaseModel | None = None,
        resume_step: int = 0,
    ) -> None:
        self.recipe = recipe
        self.resume_step = resume_step  # the checkpoint a resumed run continues from (0: a new run)
        self.dir = run_dir
        self.manager = manager
        self.hook = manager.hook
        self.streams = Streams(recipe.seed)
        reg = manager.registry
        self.single_agent = recipe.population.mode == "single_agent"
        self.base_model = base_model or reg.base_model(recipe.base_model.name, recipe.base_model.params)
        lora = recipe.lora
        self.lora = LoraSettings(lora.rank, lora.alpha, lora.dropout, tuple(lora.target_modules), lora.init_std)
        # built first: the engine and the trainer go onto its workers (None: this process, today's behaviour)
        self.cluster: Cluster | None = None
        if recipe.cluster.name == LOCAL_CLUSTER:
            refuse_idle_gpus()
        else:
            self.cluster = reg.get("cluster", recipe.cluster.name).build(
                recipe.cluster.params, run_dir=run_dir.path, plugin_files=manager.plugin_files
            )
        try:
            self._build_components(recipe, run_dir)
        except BaseException:
            if self.cluster is not None:
                self.cluster.close()
            raise
        self.population = Population.create(
            recipe.population.teachers, recipe.population.students, shared=self.single_agent
        )
        self.step = 0
        self.coverage: dict[str, set[str]] = defaultdict(set)
        self._probe: dict[str, list[Problem]] | None = None
        self.dropped: Counter[str] = Counter()  # this step's requests the engine did not generate for, by reason
        self.evolution_deferred: int | None = None  # the last step, when its evolution was due but left out
        self._last_checkpoint_s = 0.0

    def _build_components(self, recipe: Recipe, run_dir: RunDir) -> None:
        reg = self.manager.registry
        self.executor = reg.get("executor", recipe.executor.name).build(
            recipe.executor.params, plugin_files=self.manager.plugin_files
        )
        self.tasks: dict[str, Any] = {}  # filled in recipe order; each task factory may take it as `tasks`
        for i, ref in enumerate(recipe.tasks):
            if ref.name in self.tasks:
                raise UserError(f"task {ref.name!r} is listed twice in the recipe")
            rng = self.streams.task_rng(i)
            self.tasks[ref.name] = reg.get("task", ref.name).build(
                ref.params, executor=self.executor, rng=rng, tasks=self.tasks
            )
        ctx = {"base_model": self.base_model, "lora": self.lora, "seed": recipe.seed}
        engine_ctx = {**ctx, "max_prompt_tokens": recipe.rollout.max_prompt_tokens}
        if self.cluster is None:
            self.engine = reg.get("engine", recipe.engine.name).build(recipe.engine.params, **engine_ctx)
            self.trainer = reg.get("trainer", recipe.trainer.name).build(recipe.trainer.params, **ctx)
        else:
            self.engine = self.cluster.engine(recipe.engine.name, recipe.engine.params, engine_ctx)
            self.trainer = self.cluster.trainer(recipe.trainer.name, recipe.trainer.params, ctx)
        self.matchmaker = reg.get("matchmaker", recipe.matchmaker.name).build(recipe.matchmaker.params)
        evo = recipe.evolution
        self.selector = reg.get("selector", evo.selector.name).build(evo.selector.params) if evo.every else None
        self.operators: list[tuple[Component, Any, float]] = []
        for ref in evo.operators if evo.every else []:
            comp = reg.get("operator", ref.name)
            self.operators.append((comp, comp.parse_params(ref.params), ref.weight))
        self.sinks = [
            reg.get("sink", ref.name).build(ref.params, run_dir=run_dir.path, resume_step=self.resume_step)
            for ref in recipe.sinks
        ]

    # --- helpers ------------------------------------------------------------------------------

    def adapter_ref(self, member: Member) -> AdapterRef:
        return AdapterRef(member.version_name, str(self.dir.adapter_path(member.version_name)))

    def sampling(self, step: int, phase: str, *, n: int, max_tokens: int, logprobs: bool = False) -> SamplingParams:
        """Rollout sampling settings with a seed derived from (recipe seed, step, phase).

        Log-probs are asked for when the trainer reads them, or when ``logprobs`` (the proposals: the step
        metrics' ``token_nll``); asking never changes the sampled tokens."""
        cfg = self.recipe.rollout
        return SamplingParams(
            n=n,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=max_tokens,
            seed=self.streams.seed_for(step, phase),
            max_prompt_tokens=cfg.max_prompt_tokens,
            logprobs=logprobs or self.trainer.needs_sampling_logprobs,
        )

    def view(self) -> RunView:
        """What hooks receive (:class:`RunView`): the recipe, run directory, steps done, a population copy, emit."""
        return RunView(
            self.recipe, self.dir.path, self.step, Population.from_dict(self.population.to_dict()), self.emit
        )

    def emit(self, records: list[dict[str, Any]]) -> None:
        self.dir.append("events.jsonl", records)
        for sink in self.sinks:
            for record in records:
                sink.emit(record)

    # --- start / resume -----------------------------------------------------------------------

    def initialise(self) -> None:
        """Fresh adapters (version 0) for every member, then the seed buffers."""
        evolution.initialise(self)
        state.seed_buffers(self)

    def parse_proposals(
        self, texts: list[str], task_names: list[str], contexts: list[Any], proposers: list[str]
    ) -> list[Problem]:
        """Every task parses and validates its own proposals in one batch; problems come back in input order."""
        problems: list[Problem] = [None] * len(texts)  # type: ignore[list-item]
        by_task: dict[str, list[int]] = defaultdict(list)
        for i, task_name in enumerate(task_names):
            by_task[task_name].append(i)
        for task_name, idx in by_task.items():
            parsed = self.tasks[task_name].parse_proposals(
                [texts[i] for i in idx], [contexts[i] for i in idx], [proposers[i] for i in idx]
            )
            for i, problem in zip(idx, parsed):
                problems[i] = problem
        return problems

    # --- one step -----------------------------------------------------------------------------

    def run_step(self) -> dict[str, Any]:
        if self.evolution_deferred == self.step:  # `populora resume RUN steps=N`: what a longer run did here
            evolution.evolve(self, self.step)
        self.evolution_deferred = None
        step, cfg = self.step + 1, self.recipe.rollout
        timer = PhaseTimer()
        step_start = time.perf_counter()
        self.hook.on_step_start(run=self.view(), step=step)
        with timer("matchmaking"):
            matches = self._match(step)
            student_of = {m.teacher: m for m in matches}
        proposals = self._propose(step, timer)
        # matched students solve each valid problem n times
        valid = [(i, p) for i, p in enumerate(proposals) if p.valid]
        solvers = [self.population.members[student_of[p.teacher.id].student] for _, p in valid]
        attempts = [(p.task, student, p.problem) for (_, p), student in zip(valid, solvers)]
        answers = solving.solve(self, attempts, step, "sample/solve", n=cfg.solver_samples, timer=timer)
        with timer("grade"):
            rollouts = self._grade(proposals, valid, solvers, answers)
        rollouts += solving.buffer_solves(self, step, timer)
        with timer("ratings"):
            outcomes = self._rate(matches, proposals)
        self.hook.after_rewards(run=self.view(), step=step, rollouts=rollouts)
        with timer("train"):
            self.engine.sleep()
            train_stats = self._train(rollouts)
        with timer("buffers"):
            for task_name, task in self.tasks.items():
                task.add_to_buffer([p.problem for p in proposals if p.task == task_name and p.valid])
            self.dir.append("tasks/problems.jsonl", problem_records(step, proposals, student_of, self.tasks))
        self.step = step
        metrics = step_metrics(
            step, self.population, self.coverage, self.tasks, matches, outcomes, proposals, rollouts, train_stats
        )
        metrics.update({f"rollout/dropped/{reason}": n for reason, n in sorted(self.dropped.items())})
        self.dropped.clear()
        events = []
        every = self.recipe.evolution.every
        if every and step % every == 0 and not self.single_agent:
            if step < self.recipe.steps:
                with timer("evolution"):
                    events = evolution.evolve(self, step)
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
            state.checkpoint(self)
            state.prune_adapters(self)
            self._last_checkpoint_s = time.perf_counter() - start
        return metrics

    def _match(self, step: int) -> list[Match]:
        teachers = self.population.teachers
        if self.single_agent:
            matches = [Match(m.id, m.id, 0.5) for m in teachers]
        else:
            matches = self.matchmaker.pair(teachers, self.population.students, self.streams.rng(step, "match"))
        self.hook.after_matchmaking(run=self.view(), step=step, matches=matches)
        return matches

    def _propose(self, step: int, timer: PhaseTimer) -> list[Proposal]:
        """Every teacher's proposals for every task type, generated in one call and validated per task."""
        cfg = self.recipe.rollout
        with timer("prompts"):
            proposals, requests = [], []
            for task_name, task in self.tasks.items():
                rng = self.streams.rng(step, f"propose/{task_name}")
                for teacher in self.population.teachers:
                    for prompt, ctx in task.proposer_prompts(cfg.proposals_per_teacher, rng):
                        requests.append(GenerationRequest(prompt, self.adapter_ref(teacher)))
                        proposals.append(Proposal(task_name, teacher, ctx))
        with timer("generate_propose"):
            sampling = self.sampling(step, "sample/propose", n=1, max_tokens=cfg.propose_max_tokens, logprobs=True)
            completions = [c for (c,) in self.engine.generate(requests, sampling)]
        with timer("validate"):
            problems = self.parse_proposals(
                [c.text for c in completions],
                [p.task for p in proposals],
                [p.ctx for p in proposals],
                [p.teacher.version_name for p in proposals],
            )
            for proposal, completion, problem in zip(proposals, completions, problems):
                if completion.dropped:
                    problem.valid, problem.error = False, f"not generated: {completion.finish_reason}"
                    self.dropped[completion.finish_reason] += 1
                proposal.completion, proposal.problem = completion, problem
        return proposals

    def _grade(
        self,
        proposals: list[Proposal],
        valid: list[tuple[int, Proposal]],
        solvers: list[Member],
        answers: list[list[Rollout]],
    ) -> list[Rollout]:
        """Students' solve rates and rollouts, then each teacher's reward from its matched student's rate."""
        rollouts: list[Rollout] = []
        for (i, proposal), student, scored in zip(valid, solvers, answers):
            # None when every answer was dropped: the teacher is rewarded as for an unusable problem
            proposal.solve_rate = sum(r.info["correct"] for r in scored) / len(scored) if scored else None
            student.counters.estimation_rollouts += len(scored)
            if self.recipe.rollout.train_on_estimation:
                for r in scored:
                    r.info["problem"] = i
                rollouts += scored
        for i, p in enumerate(proposals):
            assert p.problem is not None and p.completion is not None
            if p.completion.dropped:
                continue
            p.teacher.counters.tokens += len(p.completion.token_ids)
            reward = self.tasks[p.task].proposer_reward(p.problem, p.solve_rate if p.valid else None)
            rollouts.append(
                Rollout.of(p.teacher.id, f"{p.task}/propose", p.completion, reward, valid=p.valid, problem=i)
            )
        return rollouts

    def _rate(self, matches: list[Match], proposals: list[Proposal]) -> list[MatchOutcome]:
        outcomes = []
        for match in matches:
            rates = [p.solve_rate for p in proposals if p.teacher.id == match.teacher and p.solve_rate is not None]
            mean = statistics.fmean(rates) if rates else None
            outcomes.append(MatchOutcome(match.teacher, match.student, mean, match.expected_solve_rate))
        if not self.single_agent:
            self.matchmaker.update_ratings(outcomes, self.population.members)
        return outcomes

    def _train(self, rollouts: list[Rollout]) -> dict[str, dict[str, Any]]:
        """One policy update per member that has rollouts; each writes the member's next version.

        A trainer with ``update_many`` gets the step's updates at once (a cluster runs them in parallel);
        otherwise they run one member at a time.
        """
        jobs: list[tuple[Member, UpdateJob]] = []
        for member in list(self.population.members.values()):
            own = [r for r in rollouts if r.member_id == member.id]
            if not own:
                continue
            parent = self.adapter_ref(member)
            member.version += 1
            jobs.append((member, UpdateJob(member.id, parent, own, self.dir.adapter_path(member.version_name))))
        update_many = getattr(self.trainer, "update_many", None)
        if update_many is not None:
            results = update_many([job for _, job in jobs])
        else:
            results = [self.trainer.update(job.member_id, job.adapter, job.rollouts, job.out_dir) for _, job in jobs]
        stats: dict[str, dict[str, Any]] = {}
        for (member, job), result in zip(jobs, results, strict=True):
            member.counters.rollouts += len(job.rollouts)
            member.counters.trained_tokens += sum(len(r.completion_token_ids) for r in job.rollouts)
            member.counters.updates += 1
            stats[member.id] = asdict(result)
        return stats

    # --- probe evaluation -----------------------------------------------------------------------

    def probe_problems(self) -> dict[str, list[Problem]]:
        """The held-out probe set per task type: the recipe's file, else the one shipped with the base."""
        if self._probe is None:
            cfg = self.recipe.probe
            path = cfg.file or self.base_model.probe_path
            if not path:
                raise UserError("probe.enabled is true but probe.file is empty and the base model ships no probe set")
            self._probe = probe_set(path, list(self.tasks), cfg.problems_per_type)
        return self._probe

    def probe(self, step: int, *, include_base: bool) -> list[dict[str, Any]]:
        """Greedy solver accuracy per task type of every student (and the base), appended to probe.jsonl."""
        targets = [ProbeTarget(m.id, self.adapter_ref(m), m.version_name, m.role) for m in self.population.students]
        if include_base:
            targets.insert(0, ProbeTarget("base", None, "base", "base"))
        problems = self.probe_problems()
        records = probe_records(step, self.engine, self.tasks, problems, targets, self.recipe.probe.max_tokens)
        self.dir.append("probe.jsonl", records)
        # observers get the accuracies; the per-problem outcomes stay in probe.jsonl only
        self.emit([{"event": "probe", **{k: v for k, v in r.items() if k != "correct"}} for r in records])
        return records

    def close(self) -> None:
        try:
            for closer in (self.engine, self.executor, *self.sinks, self.cluster):
                close = getattr(closer, "close", None)
                if close is not None:
                    close()
        finally:
            self.dir.unlock()


def start_run(recipe: Recipe, resolved: dict[str, Any], run_dir: RunDir, manager: PluginManager) -> Run:
    base = manager.registry.base_model(recipe.base_model.name, recipe.base_model.params)  # missing: no run dir
    run_dir.create(resolved)
    try:
        run_dir.lock()
        run = Run(recipe, run_dir, manager, base_model=base)
    except BaseException:
        run_dir.discard_new()  # a run that never started (no cluster, bad component) leaves no run directory
        raise
    run.initialise()
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
    """The run from its last complete checkpoint; one killed before its first starts over from step 0.

    ``overrides`` may move the run to other hardware (``cluster.name=ray``, ``cluster.params.workers=1``): where
    the components run never changes what a run computes. ``steps=N`` extends the run to N steps: the steps
    after its last are what a run planned for N steps from the start computes (adapters, lineage, problems),
    the last step's evolution included, which a run leaves out at its final step. Nothing else may change; the
    new values are written to the run's recipe once the run is built.
    """
    from .recipe import apply_overrides, parse_recipe

    recipe_file = str(run_dir.path / "recipe.yaml")
    check_resume_overrides(overrides)
    data = apply_overrides(run_dir.read_recipe(), overrides, recipe=recipe_file)
    recipe = parse_recipe(data, manager.registry, recipe=recipe_file)
    done = run_dir.checkpointed_step()
    check_resume_steps(recipe.steps, done)
    run_dir.lock()
    try:
        run = Run(recipe, run_dir, manager, resume_step=done)
    except BaseException:
        run_dir.unlock()
        raise
    if overrides:
        run_dir.write_recipe(recipe.model_dump(mode="json"))
    if done == 0:  # no checkpoint
        run_dir.clear()
        run.initialise()
    else:
        state.restore(run)
    return run


def execute(
    run: Run, *, on_step: Callable[[dict[str, Any]], None] | None = None, on_probe: Callable[[], None] | None = None
) -> None:
    """Run steps until the recipe's ``steps`` with the run hooks around them; the callbacks are for displays."""
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
        run.hook.on_run_end(run=run.view(), status=status)
        run.close()
