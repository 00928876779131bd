"""Held-out probe evaluation: greedy solver accuracy per task type, of every student and of the base.

The loop calls :func:`evaluate` before the first step and after the last (``probe`` in a recipe);
``populora_nano.probe`` uses :func:`greedy_grades` for the model card. Records carry each problem's outcome
in probe order, so two members can be compared problem by problem (paired statistics).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .components import AdapterRef, GenerationRequest, Grade, Problem, SamplingParams, Task
from .errors import UserError
from .population import Member
from .problems import load_problems

if TYPE_CHECKING:
    from .assembly import Components


@dataclass(frozen=True)
class ProbeTarget:
    """One model the probe evaluates: a student's current version, or the base (``adapter`` None)."""

    member: str
    adapter: AdapterRef | None
    version: str
    role: str


def probe_set(path: str, task_names: Sequence[str], per_type: int) -> dict[str, list[Problem]]:
    """The first ``per_type`` problems of each of ``task_names`` in the probe file, in file order."""
    problems: dict[str, list[Problem]] = {name: [] for name in task_names}
    for record in load_problems(path):
        bucket = problems.get(record.task_type)
        if bucket is not None and len(bucket) < per_type:
            bucket.append(record)
    return problems


def greedy_grades(
    engine: Any,
    tasks: Mapping[str, Task],
    problems: Mapping[str, Sequence[Problem]],
    adapters: Sequence[AdapterRef | None],
    max_tokens: int | Mapping[str, int],
) -> list[dict[str, list[Grade]]]:
    """Per adapter (in order), each task type's grades of one greedy answer per problem.

    One ``engine.generate`` call per distinct answer budget (``max_tokens``, one for all or per task type)
    serves every adapter, so a mixed-adapter batch is what the engine sees.
    """
    budgets: dict[int, list[str]] = defaultdict(list)
    for task_name, items in problems.items():
        if items:
            budgets[max_tokens if isinstance(max_tokens, int) else max_tokens[task_name]].append(task_name)
    out: list[dict[str, list[Grade]]] = [{} for _ in adapters]
    for budget, task_names in budgets.items():
        requests, origin = [], []
        for k, adapter in enumerate(adapters):
            for task_name in task_names:
                for problem in problems[task_name]:
                    requests.append(GenerationRequest(tasks[task_name].solver_prompt(problem), adapter))
                    origin.append((k, task_name, problem))
        answers = engine.generate(requests, SamplingParams(n=1, temperature=0.0, max_tokens=budget, seed=0))
        answered = [(problem, completion.text) for (_, _, problem), (completion,) in zip(origin, answers)]
        grades = _graded(tasks, [task_name for _, task_name, _ in origin], answered)
        for (k, task_name, _), grade in zip(origin, grades):
            out[k].setdefault(task_name, []).append(grade)
    return out


def _graded(tasks: Mapping[str, Task], task_names: list[str], answered: list[tuple[Problem, str]]) -> list[Grade]:
    """Each answer's grade, every task's answers checked in one executor batch."""
    from .assembly import per_task

    def batch(task: Task, idx: list[int]) -> list[Grade]:
        return [grade for (grade,) in task.grade_many([(answered[i][0], [answered[i][1]]) for i in idx])]

    return per_task(tasks, task_names, batch)


def probe_records(
    step: int,
    engine: Any,
    tasks: Mapping[str, Task],
    problems: Mapping[str, Sequence[Problem]],
    targets: Sequence[ProbeTarget],
    max_tokens: int,
) -> list[dict[str, Any]]:
    """One ``probe.jsonl`` record per (target, task type): accuracy, count and each problem's outcome."""
    grades = greedy_grades(engine, tasks, problems, [t.adapter for t in targets], max_tokens)
    return [
        {
            "step": step,
            "member": target.member,
            "version": target.version,
            "role": target.role,
            "task_type": task_name,
            "accuracy": statistics.fmean(g.correct for g in per_task[task_name]),
            "n": len(per_task[task_name]),
            "correct": [int(g.correct) for g in per_task[task_name]],
        }
        for target, per_task in zip(targets, grades)
        for task_name in problems
        if per_task.get(task_name)
    ]


def run_probe_set(c: Components) -> dict[str, list[Problem]]:
    """A run's held-out probe set per task type: the recipe's file, else the one shipped with the base."""
    cfg = c.recipe.probe
    path = cfg.file or c.base_model.probe_path
    if not path:
        raise UserError("probe.enabled is true but probe.file is empty and the base model ships no probe set")
    return probe_set(path, list(c.tasks), cfg.problems_per_type)


def evaluate(c: Components, students: Sequence[Member], step: int, *, include_base: bool) -> list[dict[str, Any]]:
    """The probe records of a run's students' current versions (and the base first, with ``include_base``)."""
    targets = [ProbeTarget(m.id, c.adapter_ref(m), m.version_name, m.role) for m in students]
    if include_base:
        targets.insert(0, ProbeTarget("base", None, "base", "base"))
    return probe_records(step, c.engine, c.tasks, run_probe_set(c), targets, c.recipe.probe.max_tokens)
