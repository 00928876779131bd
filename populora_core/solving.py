"""Students answer problems: ``n`` sampled answers each, graded by the task, counted on the student."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .components import GenerationRequest, Problem, Rollout
from .metrics import PhaseTimer
from .population import Member

if TYPE_CHECKING:
    from .loop import Run


def buffer_solves(run: Run, step: int, timer: PhaseTimer) -> list[Rollout]:
    """AZR's solver batch: buffer problems each student solves once (trained, not estimating)."""
    k = run.recipe.rollout.buffer_problems_per_student
    if not k:
        return []
    attempts = []
    for task_name, task in run.tasks.items():
        for student in run.population.students:
            rng = run.streams.rng(step, f"buffer/{task_name}/{student.id}")
            attempts += [(task_name, student, problem) for problem in task.sample_problems(k, rng)]
    scored = solve(run, attempts, step, "sample/buffer", n=1, timer=timer, phase="generate_buffer")
    rollouts = [r for answers in scored for r in answers]
    for r in rollouts:
        r.info["buffer"] = True
    return rollouts


def solve(
    run: Run,
    attempts: Sequence[tuple[str, Member, Problem | None]],
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
            GenerationRequest(run.tasks[task_name].solver_prompt(problem), run.adapter_ref(student))
            for task_name, student, problem in attempts
        ]
    with timer(phase):
        sampling = run.sampling(step, stream, n=n, max_tokens=run.recipe.rollout.solve_max_tokens)
        answers = run.engine.generate(requests, sampling)
    out = []
    with timer("grade"):
        for (task_name, student, problem), completions in zip(attempts, answers):
            assert problem is not None
            run.dropped.update(c.finish_reason for c in completions if c.dropped)
            completions = [c for c in completions if not c.dropped]
            grades = run.tasks[task_name].grade(problem, [c.text for c in completions]) if completions else []
            student.counters.tokens += sum(len(c.token_ids) for c in completions)
            run.coverage[student.id].add(problem.signature)
            rows = [
                Rollout.of(student.id, f"{task_name}/solve", c, g.reward, correct=g.correct)
                for c, g in zip(completions, grades)
            ]
            out.append(rows)
    return out
