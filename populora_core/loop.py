"""The co-evolution loop: one step, stage by stage, through components and lifecycle hooks.

step: matchmaking -> teachers propose (every task type) -> validation in the executor -> matched
students solve n samples per valid problem -> rewards (students; teachers from their MATCHED
student's solve rate) -> rating updates -> one policy update per member -> metrics; every E steps
selection and replacement with LoRA operators; checkpoints atomically. The single-agent baseline is
the same step with each adapter matched with itself.

Randomness is derived per (seed, step, phase), so a resumed run draws exactly what an uninterrupted
one would.
"""

from __future__ import annotations

import pickle
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .components import (
    AdapterRef,
    BaseModel,
    GenerationRequest,
    LoraSettings,
    Match,
    MatchOutcome,
    Problem,
    Rollout,
    SamplingParams,
    load_problems,
)
from .errors import UserError
from .plugins import PluginManager
from .population import Lineage, Member, Population, Rating
from .recipe import ComponentRef, Recipe
from .registry import Component, Registry
from .run import RunDir

#: Phases whose time is model compute; everything else counts as orchestration.
MODEL_PHASES = ("generate_propose", "generate_solve", "generate_buffer", "train")


def derived_rng(seed: int, step: int, phase: str) -> random.Random:
    return random.Random(f"{seed}/{step}/{phase}")


def derived_seed(seed: int, step: int, phase: str) -> int:
    return derived_rng(seed, step, phase).randrange(2**31)


def build_component(registry: Registry, kind: str, ref: ComponentRef, **context: Any) -> Any:
    component = registry.get(kind, ref.name)
    return component.factory(component.parse_params(ref.params), **context)


def resolve_base_model(ref: ComponentRef, registry: Registry) -> BaseModel:
    """A registered short name (``nano``) through its plugin; anything else is a path or hub id."""
    if ref.name in registry.names("base_model"):
        resolved = build_component(registry, "base_model", ref)
        if not isinstance(resolved, BaseModel):
            raise UserError(f"base model {ref.name!r} factory must return components.BaseModel")
        return resolved
    return BaseModel(path=ref.name, name=ref.name)


class PhaseTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start


class Run:
    """A live run: recipe, components, population, run directory. Hooks receive this object."""

    def __init__(self, recipe: Recipe, run_dir: RunDir, manager: PluginManager) -> None:
        self.recipe = recipe
        self.dir = run_dir
        self.manager = manager
        self.hook = manager.hook
        reg = manager.registry
        self.single_agent = recipe.population.mode == "single_agent"
        self.base_model = resolve_base_model(recipe.base_model, reg)
        lora = recipe.lora
        self.lora = LoraSettings(
            rank=lora.rank,
            alpha=lora.alpha,
            dropout=lora.dropout,
            target_modules=tuple(lora.target_modules),
            init_std=lora.init_std,
        )
        self.executor = build_component(reg, "executor", recipe.executor)
        self.tasks: dict[str, Any] = {}
        for i, ref in enumerate(recipe.tasks):
            if ref.name in self.tasks:
                raise UserError(f"task {ref.name!r} is listed twice in the recipe")
            self.tasks[ref.name] = build_component(
                reg, "task", ref, executor=self.executor, rng=random.Random(f"{recipe.seed}/task/{i}")
            )
        ctx = {"base_model": self.base_model, "lora": self.lora, "seed": recipe.seed}
        self.engine = build_component(reg, "engine", recipe.engine, **ctx)
        self.trainer = build_component(reg, "trainer", recipe.trainer, **ctx)
        self.matchmaker = build_component(reg, "matchmaker", recipe.matchmaker)
        evo = recipe.evolution
        self.selector = build_component(reg, "selector", evo.selector) if evo.every else None
        self.operators: list[tuple[Component, Any, float]] = []
        if evo.every:
            for ref in evo.operators:
                comp = reg.get("operator", ref.name)
                self.operators.append((comp, comp.parse_params(ref.params), ref.weight))
        self.sinks = [build_component(reg, "sink", ref, run_dir=run_dir.path) for ref in recipe.sinks]
        self.population = Population.create(
            recipe.population.teachers, recipe.population.students, shared=self.single_agent
        )
        self.step = 0
        self.coverage: dict[str, set[str]] = defaultdict(set)
        self.last_metrics: dict[str, Any] = {}
        self._probe: dict[str, list[Problem]] | None = None
        self._last_checkpoint_s = 0.0

    # --- helpers ------------------------------------------------------------------------------

    def adapter_ref(self, member: Member) -> AdapterRef:
        return AdapterRef(member.version_name, str(self.dir.adapter_path(member.version_name)))

    def sampling(self, step: int, phase: str, *, n: int, max_tokens: int) -> SamplingParams:
        """Rollout sampling settings with a seed derived from (recipe seed, step, phase)."""
        cfg = self.recipe.rollout
        return SamplingParams(
            n=n,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=max_tokens,
            seed=derived_seed(self.recipe.seed, step, phase),
        )

    def emit(self, records: list[dict[str, Any]]) -> None:
        self.dir.append("events.jsonl", records)
        for sink in self.sinks:
            for record in records:
                sink.emit(record)

    # --- start / resume -----------------------------------------------------------------------

    def initialise(self) -> None:
        """Fresh adapters (version 0) for every member, from the base model's module shapes."""
        from .adapters import init_lora, save_lora

        for i, member in enumerate(self.population.members.values()):
            weights = init_lora(
                self.base_model.path,
                rank=self.lora.rank,
                alpha=self.lora.alpha,
                target_modules=self.lora.target_modules,
                dropout=self.lora.dropout,
                seed=derived_seed(self.recipe.seed, 0, f"init/{i}"),
                init_std=self.lora.init_std,
            )
            save_lora(weights, self.dir.adapter_path(member.version_name))
            member.lineage = Lineage(operator="init", seed=derived_seed(self.recipe.seed, 0, f"init/{i}"))
        self.seed_buffers()
        self.dir.append(
            "lineage.jsonl",
            [
                {
                    "step": 0,
                    "child": m.version_name,
                    "member": m.id,
                    "role": m.role,
                    "parents": [],
                    "operator": "init",
                    "params": {},
                    "seed": m.lineage.seed,
                }
                for m in self.population.members.values()
            ],
        )

    def seed_buffers(self) -> None:
        """Fill each task's buffer with the seed problems of its type (recipe ``seeds``), before step 1."""
        cfg = self.recipe.seeds
        if not cfg.enabled:
            return
        problems = load_problems(cfg.file)
        counts = {}
        for name, task in self.tasks.items():
            own = [p for p in problems if p.task_type == name and p.valid]
            task.add_to_buffer(own)
            counts[name] = len(own)
        if not any(counts.values()):
            kinds = ", ".join(self.tasks)
            raise UserError(f"seeds file {cfg.file}: no valid problem of the recipe's task types ({kinds})")
        self.emit([{"event": "seeds", "step": 0, "file": cfg.file, **{f"seeds/{k}": v for k, v in counts.items()}}])

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

    def restore(self) -> None:
        path = self.dir.latest_checkpoint()
        if path is None:
            raise UserError(f"{self.dir.path} has no complete checkpoint to resume from")
        state = self.dir.read_checkpoint(path)
        self.dir.rollback_to(state)
        self.step = state["step"]
        self.population = Population.from_dict(state["population"])
        self.coverage = defaultdict(set, {k: set(v) for k, v in state["coverage"].items()})
        for name, task in self.tasks.items():
            task.load_state_dict(pickle.loads((path / "tasks" / f"{name}.pkl").read_bytes()))
        if hasattr(self.matchmaker, "load_state_dict") and state.get("matchmaker") is not None:
            self.matchmaker.load_state_dict(state["matchmaker"])
        self.trainer.load_state(path / "trainer")

    def checkpoint(self) -> Path:
        def write_tasks(directory: Path) -> None:
            for name, task in self.tasks.items():
                (directory / f"{name}.pkl").write_bytes(pickle.dumps(task.state_dict()))

        state = {
            "population": self.population.to_dict(),
            "coverage": {k: sorted(v) for k, v in self.coverage.items()},
            "matchmaker": self.matchmaker.state_dict() if hasattr(self.matchmaker, "state_dict") else None,
        }
        path = self.dir.write_checkpoint(
            self.step,
            state,
            {"tasks": write_tasks, "trainer": self.trainer.save_state},
            keep=self.recipe.checkpoint.keep,
        )
        self.hook.on_checkpoint(run=self, step=self.step, path=str(path))
        return path

    # --- one step -----------------------------------------------------------------------------

    def run_step(self) -> dict[str, Any]:
        step = self.step + 1
        seed = self.recipe.seed
        cfg = self.recipe.rollout
        timer = PhaseTimer()
        step_start = time.perf_counter()
        self.hook.on_step_start(run=self, step=step)
        members = self.population.members

        with timer("matchmaking"):
            teachers = self.population.teachers
            if self.single_agent:
                matches = [Match(m.id, m.id, 0.5) for m in teachers]
            else:
                matches = self.matchmaker.pair(teachers, self.population.students, derived_rng(seed, step, "match"))
            self.hook.after_matchmaking(run=self, step=step, matches=matches)
            student_of = {m.teacher: m for m in matches}

        # teachers propose, for every task type
        with timer("prompts"):
            requests, origin = [], []
            for task_name, task in self.tasks.items():
                rng = derived_rng(seed, step, f"propose/{task_name}")
                for teacher in teachers:
                    for prompt, ctx in task.proposer_prompts(cfg.proposals_per_teacher, rng):
                        requests.append(GenerationRequest(prompt, self.adapter_ref(teacher)))
                        origin.append((task_name, teacher.id, ctx))
        with timer("generate_propose"):
            proposals = self.engine.generate(
                requests,
                self.sampling(step, "sample/propose", n=1, max_tokens=cfg.propose_max_tokens),
            )

        with timer("validate"):
            problems = self.parse_proposals(
                [c[0].text for c in proposals],
                [task_name for task_name, _, _ in origin],
                [ctx for _, _, ctx in origin],
                [members[teacher_id].version_name for _, teacher_id, _ in origin],
            )

        # matched students solve each valid problem n times
        solve_origin = [i for i, problem in enumerate(problems) if problem.valid]
        solvers = [members[student_of[origin[i][1]].student] for i in solve_origin]
        answers = self.solve(
            [(origin[i][0], student, problems[i]) for i, student in zip(solve_origin, solvers)],
            step,
            "sample/solve",
            n=cfg.solver_samples,
            timer=timer,
            phase="generate_solve",
        )

        rollouts: list[Rollout] = []
        solve_rate: dict[int, float] = {}
        with timer("grade"):
            for i, student, scored in zip(solve_origin, solvers, answers):
                solve_rate[i] = sum(r.info["correct"] for r in scored) / max(len(scored), 1)
                student.counters.estimation_rollouts += len(scored)
                if cfg.train_on_estimation:
                    for r in scored:
                        r.info["problem"] = i
                    rollouts += scored
            for i, problem in enumerate(problems):
                task_name, teacher_id, _ = origin[i]
                teacher = members[teacher_id]
                c = proposals[i][0]
                teacher.counters.tokens += len(c.token_ids)
                reward = self.tasks[task_name].proposer_reward(problem, solve_rate.get(i) if problem.valid else None)
                rollouts.append(
                    Rollout.of(teacher.id, f"{task_name}/propose", c, reward, valid=problem.valid, problem=i)
                )

        rollouts += self._buffer_solves(step, timer)

        with timer("ratings"):
            outcomes = []
            for match in matches:
                rates = [solve_rate[i] for i, (_, t, _) in enumerate(origin) if t == match.teacher and i in solve_rate]
                outcomes.append(
                    MatchOutcome(
                        match.teacher,
                        match.student,
                        statistics.fmean(rates) if rates else None,
                        match.expected_solve_rate,
                    )
                )
            if not self.single_agent:
                self.matchmaker.update_ratings(outcomes, members)

        self.hook.after_rewards(run=self, step=step, rollouts=rollouts)

        train_stats: dict[str, Any] = {}
        with timer("train"):
            for member in list(members.values()):
                own = [r for r in rollouts if r.member_id == member.id]
                if not own:
                    continue
                parent = self.adapter_ref(member)
                member.version += 1
                stats = self.trainer.update(member.id, parent, own, self.dir.adapter_path(member.version_name))
                member.counters.rollouts += len(own)
                member.counters.trained_tokens += sum(len(r.completion_token_ids) for r in own)
                member.counters.updates += 1
                train_stats[member.id] = asdict(stats)

        with timer("buffers"):
            for task_name in self.tasks:
                self.tasks[task_name].add_to_buffer(
                    [p for p, (t, _, _) in zip(problems, origin) if t == task_name and p.valid]
                )
            self._record_problems(step, problems, origin, student_of, solve_rate)

        self.step = step
        metrics = self._step_metrics(step, matches, outcomes, problems, origin, rollouts, train_stats)
        events = []
        evolve_now = self.recipe.evolution.every and step % self.recipe.evolution.every == 0
        if evolve_now and step < self.recipe.steps and not self.single_agent:  # a last-step child would never train
            with timer("evolution"):
                events = self.evolve(step)
        timer.seconds["checkpoint"] += self._last_checkpoint_s  # the previous step's, paid between steps
        total = time.perf_counter() - step_start + self._last_checkpoint_s
        model_s = sum(timer.seconds[p] for p in MODEL_PHASES)
        metrics.update({f"time/{k}": v for k, v in timer.seconds.items()})
        metrics.update(
            {
                "time/step": total,
                "time/orchestration_share": max(total - model_s, 0.0) / total,
                "evolution/children": len(events),
            }
        )
        self.emit([{"event": "step", **metrics}])
        self.hook.on_step_end(run=self, step=step, metrics=metrics)
        probe = self.recipe.probe
        if probe.enabled and (step == self.recipe.steps or (probe.every and step % probe.every == 0)):
            self.probe(step, include_base=False)
        self._last_checkpoint_s = 0.0
        if step % self.recipe.checkpoint.every == 0 or step == self.recipe.steps:
            start = time.perf_counter()
            self.checkpoint()
            self._last_checkpoint_s = time.perf_counter() - start
        self.last_metrics = metrics
        return metrics

    def _buffer_solves(self, step: int, timer: PhaseTimer) -> list[Rollout]:
        """AZR's solver batch: buffer problems each student solves once (trained, not estimating)."""
        k = self.recipe.rollout.buffer_problems_per_student
        if not k:
            return []
        attempts = []
        for task_name, task in self.tasks.items():
            for student in self.population.students:
                rng = derived_rng(self.recipe.seed, step, f"buffer/{task_name}/{student.id}")
                attempts += [(task_name, student, problem) for problem in task.sample_problems(k, rng)]
        rollouts = [
            r
            for scored in self.solve(attempts, step, "sample/buffer", n=1, timer=timer, phase="generate_buffer")
            for r in scored
        ]
        for r in rollouts:
            r.info["buffer"] = True
        return rollouts

    def solve(
        self,
        attempts: Sequence[tuple[str, Member, Problem]],
        step: int,
        stream: str,
        *,
        n: int,
        timer: PhaseTimer | None = None,
        phase: str = "generate_solve",
    ) -> list[list[Rollout]]:
        """Each ``(task name, student, problem)``: ``n`` sampled answers of the student, graded by the task.

        Returns the answers as the student's rollouts (``info["correct"]``), per attempt in order, and
        counts the student's tokens and covered problems. ``stream`` names the sampling seed's phase.
        """
        if not attempts:
            return []
        timer = timer or PhaseTimer()
        with timer("prompts"):
            requests = [
                GenerationRequest(self.tasks[task_name].solver_prompt(problem), self.adapter_ref(student))
                for task_name, student, problem in attempts
            ]
        with timer(phase):
            answers = self.engine.generate(
                requests, self.sampling(step, stream, n=n, max_tokens=self.recipe.rollout.solve_max_tokens)
            )
        out = []
        with timer("grade"):
            for (task_name, student, problem), completions in zip(attempts, answers):
                grades = self.tasks[task_name].grade(problem, [c.text for c in completions])
                student.counters.tokens += sum(len(c.token_ids) for c in completions)
                self.coverage[student.id].add(problem.signature)
                out.append(
                    [
                        Rollout.of(student.id, f"{task_name}/solve", c, g.reward, correct=g.correct)
                        for c, g in zip(completions, grades)
                    ]
                )
        return out

    def _record_problems(
        self,
        step: int,
        problems: list[Problem],
        origin: list[tuple[str, str, Any]],
        student_of: dict[str, Match],
        solve_rate: dict[int, float],
    ) -> None:
        records = []
        for i, p in enumerate(problems):
            task_name, teacher_id, _ = origin[i]
            records.append(
                {
                    "step": step,
                    "task_type": task_name,
                    "proposer": teacher_id,
                    "proposer_version": p.proposer,
                    "program": p.program,
                    "inputs": p.inputs,
                    "outputs": p.outputs,
                    "message": p.message,
                    "valid": p.valid,
                    "error": p.error or "",
                    "matched_student": student_of[teacher_id].student,
                    "solve_rate": solve_rate.get(i),
                    "signature": p.signature,
                    **{f"metric_{k}": v for k, v in p.metrics.items()},
                }
            )
        self.dir.append("tasks/problems.jsonl", records)

    def _step_metrics(
        self,
        step: int,
        matches: list[Match],
        outcomes: list[MatchOutcome],
        problems: list[Problem],
        origin: list[tuple[str, str, Any]],
        rollouts: list[Rollout],
        train_stats: dict[str, Any],
    ) -> dict[str, Any]:
        m: dict[str, Any] = {"step": step, "matches": [[x.teacher, x.student] for x in matches]}
        members = self.population.members
        for member in members.values():
            own = [r.reward for r in rollouts if r.member_id == member.id]
            prefix = f"member/{member.id}"
            m[f"{prefix}/version"] = member.version
            m[f"{prefix}/reward"] = statistics.fmean(own) if own else None
            m[f"{prefix}/rating_mu"] = member.rating.mu
            m[f"{prefix}/rating_sigma"] = member.rating.sigma
            m.update({f"{prefix}/counters/{k}": v for k, v in asdict(member.counters).items()})
            if member.id in train_stats:
                m.update(
                    {f"{prefix}/train/{k}": v for k, v in train_stats[member.id].items() if isinstance(v, (int, float))}
                )
        for member in self.population.students:
            solved = [r.info["correct"] for r in rollouts if r.member_id == member.id and "correct" in r.info]
            m[f"member/{member.id}/solve_rate"] = statistics.fmean(solved) if solved else None
            m[f"member/{member.id}/coverage"] = len(self.coverage[member.id])
        for teacher in self.population.teachers:
            mine = [p for p, o in zip(problems, origin) if o[1] == teacher.id]
            valid = [p for p in mine if p.valid]
            m[f"member/{teacher.id}/validity"] = len(valid) / len(mine) if mine else None
            for key in ("ast_depth", "cyclomatic", "loc"):
                vals = [p.metrics[key] for p in valid if key in p.metrics]
                m[f"member/{teacher.id}/{key}"] = statistics.fmean(vals) if vals else None
        for task_name in self.tasks:
            mine = [p for p, o in zip(problems, origin) if o[0] == task_name]
            m[f"task/{task_name}/validity"] = sum(p.valid for p in mine) / len(mine) if mine else None
        for o in outcomes:
            m[f"match/{o.teacher}-{o.student}/solve_rate"] = o.solve_rate
        solved = [r.info["correct"] for r in rollouts if "correct" in r.info]
        m["solve_rate"] = statistics.fmean(solved) if solved else None
        m["validity"] = sum(p.valid for p in problems) / len(problems) if problems else None
        return m

    # --- probe evaluation -----------------------------------------------------------------------

    def probe_problems(self) -> dict[str, list[Problem]]:
        """The held-out probe set per task type: the recipe's file, else the one shipped with the base."""
        if self._probe is None:
            cfg = self.recipe.probe
            path = cfg.file or self.base_model.probe_path
            if not path:
                raise UserError("probe.enabled is true but probe.file is empty and the base model ships no probe set")
            self._probe = {name: [] for name in self.tasks}
            for record in load_problems(path):
                bucket = self._probe.get(record.task_type)
                if bucket is not None and len(bucket) < cfg.problems_per_type:
                    bucket.append(record)
        return self._probe

    def probe(self, step: int, *, include_base: bool) -> list[dict[str, Any]]:
        """Greedy solver accuracy per task type of every student (and the base), appended to probe.jsonl.

        Records carry each problem's outcome in probe order, so two members can be compared problem by problem.
        """
        problems = self.probe_problems()
        targets: list[tuple[str, AdapterRef | None, str, str]] = [
            (m.id, self.adapter_ref(m), m.version_name, m.role) for m in self.population.students
        ]
        if include_base:
            targets.insert(0, ("base", None, "base", "base"))
        requests, origin = [], []
        for member_id, ref, _, _ in targets:
            for task_name, items in problems.items():
                for problem in items:
                    requests.append(GenerationRequest(self.tasks[task_name].solver_prompt(problem), ref))
                    origin.append((member_id, task_name, problem))
        outs = self.engine.generate(
            requests, SamplingParams(n=1, temperature=0.0, max_tokens=self.recipe.probe.max_tokens, seed=0)
        )
        correct: dict[tuple[str, str], list[bool]] = defaultdict(list)
        for (member_id, task_name, problem), (completion,) in zip(origin, outs):
            (grade,) = self.tasks[task_name].grade(problem, [completion.text])
            correct[(member_id, task_name)].append(grade.correct)
        records = [
            {
                "step": step,
                "member": member_id,
                "version": version,
                "role": role,
                "task_type": task_name,
                "accuracy": statistics.fmean(correct[(member_id, task_name)]),
                "n": len(correct[(member_id, task_name)]),
                "correct": [int(c) for c in correct[(member_id, task_name)]],  # per problem, for paired statistics
            }
            for member_id, _, version, role in targets
            for task_name in problems
            if correct[(member_id, task_name)]
        ]
        self.dir.append("probe.jsonl", records)
        # observers get the accuracies; the per-problem outcomes stay in probe.jsonl only
        self.emit([{"event": "probe", **{k: v for k, v in r.items() if k != "correct"}} for r in records])
        return records

    # --- evolution ----------------------------------------------------------------------------

    def evolve(self, step: int) -> list[dict[str, Any]]:
        """Selection and replacement per sub-population with weight-space operators."""
        from .adapters import load_lora, save_lora

        assert self.selector is not None
        self.hook.before_evolution(run=self, step=step, population=self.population)
        rng = derived_rng(self.recipe.seed, step, "evolution")
        evo = self.recipe.evolution
        events: list[dict[str, Any]] = []
        for role, group in sorted(self.population.subpopulations().items()):
            if role not in evo.subpopulations or len(group) < 2:
                continue
            for rep in self.selector.select(group, rng):
                comp, params = self._choose_operator(rep, rng)
                arity = comp.meta["parents"]
                parent_ids = rep.parents[:1] if arity == 1 else (rep.parents[:arity] if arity else rep.parents)
                parents = [self.population.members[p] for p in parent_ids]
                op_seed = rng.randrange(2**31)
                child_weights = _apply_operator(
                    comp, params, [load_lora(self.adapter_ref(p).path) for p in parents], op_seed
                )
                dead = self.population.remove(rep.dead)
                prefix = dead.id.rstrip("0123456789")
                params_dict = params.model_dump(mode="json")
                child = self.population.add_new(
                    prefix,
                    dead.role,
                    born_step=step,
                    lineage=Lineage([p.version_name for p in parents], comp.name, params_dict, op_seed, step),
                )
                if evo.child_rating == "inherit":
                    child.rating = Rating(parents[0].rating.mu, parents[0].rating.sigma)
                save_lora(child_weights, self.dir.adapter_path(child.version_name))
                if evo.child_optimizer == "inherit":
                    self.trainer.copy_state(parents[0].id, child.id)
                self.trainer.forget(dead.id)
                events.append(
                    {
                        "step": step,
                        "child": child.version_name,
                        "member": child.id,
                        "role": child.role,
                        "replaced": dead.id,
                        "parents": [p.version_name for p in parents],
                        "operator": comp.name,
                        "params": params_dict,
                        "seed": op_seed,
                        "rank": child_weights.rank,
                    }
                )
        self.dir.append("lineage.jsonl", events)
        self.emit([{"event": "evolution", **e} for e in events])
        self.hook.after_evolution(run=self, step=step, events=events)
        return events

    def _choose_operator(self, rep: Any, rng: random.Random) -> tuple[Component, Any]:
        if rep.operator:
            comp = self.manager.registry.get("operator", rep.operator)
            return comp, comp.parse_params(rep.params)
        fits = [
            (c, p, w)
            for c, p, w in self.operators
            if (c.meta["parents"] == 1 or (not rep.mutation_only and len(rep.parents) >= max(c.meta["parents"], 2)))
        ]
        if not fits:
            raise UserError(
                "evolution: no operator in the recipe's mix fits "
                f"{len(rep.parents)} parent(s){' (mutation only)' if rep.mutation_only else ''}; "
                "add a mutation operator to evolution.operators"
            )
        comp, params, _ = rng.choices(fits, weights=[w for _, _, w in fits])[0]
        return comp, params

    # --- whole run ----------------------------------------------------------------------------

    def close(self) -> None:
        for closer in (self.engine, self.executor, *self.sinks):
            close = getattr(closer, "close", None)
            if close is not None:
                close()


def _apply_operator(comp: Component, params: Any, parents: list[Any], seed: int) -> Any:
    import torch

    from .adapters import check_compatible

    check_compatible(parents)
    return comp.factory(parents, params, torch.Generator().manual_seed(seed))


def start_run(recipe: Recipe, resolved: dict[str, Any], run_dir: RunDir, manager: PluginManager) -> Run:
    run_dir.create(resolved)
    run = Run(recipe, run_dir, manager)
    run.initialise()
    return run


def resume_run(run_dir: RunDir, manager: PluginManager) -> Run:
    from .recipe import parse_recipe

    recipe = parse_recipe(run_dir.read_recipe(), manager.registry, recipe=str(run_dir.path / "recipe.yaml"))
    run = Run(recipe, run_dir, manager)
    run.restore()
    return run


def execute(run: Run, *, progress: bool | None = None) -> None:
    """Run steps until the recipe's ``steps``, with a live display on a TTY; hooks around it."""
    import sys

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    console = Console(stderr=True)
    show = console.is_terminal if progress is None else progress
    run.hook.on_run_start(run=run)
    status = "failed"
    try:
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            disable=not show,
        ) as bar:
            task = bar.add_task(run.recipe.name, total=run.recipe.steps, completed=run.step, info="")
            if run.recipe.probe.enabled and run.step == 0:
                bar.update(task, info="probe evaluation of the base and the initial students")
                run.probe(0, include_base=True)
            while run.step < run.recipe.steps:
                m = run.run_step()
                info = (
                    f"solve {_fmt(m.get('solve_rate'))} valid {_fmt(m.get('validity'))} "
                    f"children {m.get('evolution/children', 0)} {m['time/step']:.1f}s/step"
                )
                bar.update(task, completed=run.step, info=info)
                if not show:
                    print(f"[{run.recipe.name}] step {run.step}/{run.recipe.steps} {info}", file=sys.stderr, flush=True)
        status = "completed"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        run.hook.on_run_end(run=run, status=status)
        run.close()


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
