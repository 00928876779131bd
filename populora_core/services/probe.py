"""Held-out probe evaluation: solver accuracy per task type, of every student and of the base.

The loop calls :func:`populora_core.run.probe.evaluate` before the first step and after the last (``probe`` in a
recipe): greedy accuracy, and with ``probe.samples: k`` per-sample accuracy of k answers at ``probe.temperature``
beside it.
``populora_nano.probe`` uses :func:`greedy_grades` for the model card. Records carry each problem's outcome
in probe order, so two members can be compared problem by problem (paired statistics,
:mod:`populora_core.services.statistics`).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..api.components import AdapterRef, GenerationRequest, Grade, Problem, SamplingParams, Task
from ..api.errors import UserError
from .batching import per_task
from .problems import load_problems

#: A probe record's per-problem lists (greedy outcome; count of correct samples): probe.jsonl keeps them, events do not.
OUTCOMES = ("correct", "sample_correct")


@dataclass(frozen=True)
class ProbeTarget:
    """One model the probe evaluates: a student's current version, or the base (``adapter`` None)."""

    member: str
    adapter: AdapterRef | None
    version: str
    role: str


def probe_set(path: str, tasks: Mapping[str, Task[Any]], per_type: int | None) -> dict[str, list[Problem]]:
    """The first ``per_type`` distinct problems (by :meth:`Task.problem_key`) of each of ``tasks`` in the probe
    file, in file order (``None``: all of them). Asking more than the file holds of a type is a :class:`UserError`
    naming ``probe.problems_per_type``: a smaller probe than asked would narrow nothing and say nothing."""
    problems: dict[str, list[Problem]] = {name: [] for name in tasks}
    seen: set[tuple[str, Hashable]] = set()
    for record in load_problems(path, tasks):
        bucket = problems[record.task_type]
        key = (record.task_type, tasks[record.task_type].problem_key(record))
        if key not in seen and (per_type is None or len(bucket) < per_type):
            seen.add(key)
            bucket.append(record)
    short = {name: len(items) for name, items in problems.items() if per_type is not None and len(items) < per_type}
    if short:
        held = ", ".join(f"{n} {name}" for name, n in short.items())
        raise UserError(
            f"probe.problems_per_type: {per_type} asked, but {path} holds {held} distinct problems; "
            "lower it, leave it unset (every problem of the file) or point probe.file at a larger probe set"
        )
    return problems


def greedy_grades(
    engine: Any,
    tasks: Mapping[str, Task],
    problems: Mapping[str, Sequence[Problem]],
    adapters: Sequence[AdapterRef | None],
    max_tokens: int | Mapping[str, int],
) -> list[dict[str, list[Grade]]]:
    """Per adapter (in order), each task type's grades of one greedy answer per problem."""
    sampling = SamplingParams(n=1, temperature=0.0, seed=0)
    graded = sampled_grades(engine, tasks, problems, adapters, max_tokens, sampling)
    return [{name: [g for (g,) in per_problem] for name, per_problem in by_task.items()} for by_task in graded]


def sampled_grades(
    engine: Any,
    tasks: Mapping[str, Task],
    problems: Mapping[str, Sequence[Problem]],
    adapters: Sequence[AdapterRef | None],
    max_tokens: int | Mapping[str, int],
    sampling: SamplingParams,
) -> list[dict[str, list[list[Grade]]]]:
    """Per adapter (in order), each task type's grades of ``sampling.n`` answers per problem.

    One ``engine.generate`` call per distinct answer budget (``max_tokens``, one for all or per task type)
    serves every adapter, so a mixed-adapter batch is what the engine sees; ``sampling``'s own
    ``max_tokens`` is replaced by that budget. Its fixed seed gives every adapter the same draws.
    """
    budgets: dict[int, list[str]] = defaultdict(list)
    for task_name, items in problems.items():
        if items:
            budgets[max_tokens if isinstance(max_tokens, int) else max_tokens[task_name]].append(task_name)
    out: list[dict[str, list[list[Grade]]]] = [{} for _ in adapters]
    for budget, task_names in budgets.items():
        requests, origin = [], []
        for k, adapter in enumerate(adapters):
            for task_name in task_names:
                for problem in problems[task_name]:
                    requests.append(GenerationRequest(tasks[task_name].solver_prompt(problem), adapter))
                    origin.append((k, task_name, problem))
        answers = engine.generate(requests, replace(sampling, max_tokens=budget))
        answered = [(problem, [c.text for c in completions]) for (_, _, problem), completions in zip(origin, answers)]
        grades = _graded(tasks, [task_name for _, task_name, _ in origin], answered)
        for (k, task_name, _), grade in zip(origin, grades):
            out[k].setdefault(task_name, []).append(grade)
    return out


def _graded(
    tasks: Mapping[str, Task], task_names: list[str], answered: list[tuple[Problem, list[str]]]
) -> list[list[Grade]]:
    """Each problem's answers' grades, every task's answers checked in one executor batch."""

    def batch(task: Task, idx: list[int]) -> list[list[Grade]]:
        return task.grade_many([answered[i] for i in idx])

    return per_task(tasks, task_names, batch)


def probe_records(
    step: int,
    engine: Any,
    tasks: Mapping[str, Task],
    problems: Mapping[str, Sequence[Problem]],
    targets: Sequence[ProbeTarget],
    max_tokens: int,
    sampling: SamplingParams | None = None,
) -> list[dict[str, Any]]:
    """One ``probe.jsonl`` record per (target, task type): greedy accuracy, count and each problem's outcome,
    and with ``sampling`` the per-sample accuracy of its ``n`` answers and each problem's count of correct ones."""
    grades = greedy_grades(engine, tasks, problems, [t.adapter for t in targets], max_tokens)
    sampled = (
        sampled_grades(engine, tasks, problems, [t.adapter for t in targets], max_tokens, sampling)
        if sampling is not None
        else None
    )
    records = []
    for k, (target, by_task) in enumerate(zip(targets, grades)):
        for task_name in problems:
            if not by_task.get(task_name):
                continue
            record = {
                "step": step,
                "member": target.member,
                "version": target.version,
                "role": target.role,
                "task_type": task_name,
                "accuracy": statistics.fmean(g.correct for g in by_task[task_name]),
                "n": len(by_task[task_name]),
                "correct": [int(g.correct) for g in by_task[task_name]],
            }
            if sampled is not None and sampling is not None:
                counts = [sum(g.correct for g in answers) for answers in sampled[k][task_name]]
                record["samples"] = sampling.n
                record["temperature"] = sampling.temperature
                record["sample_accuracy"] = sum(counts) / (sampling.n * len(counts))
                record["sample_correct"] = counts
            records.append(record)
    return records
