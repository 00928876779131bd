"""What a step reports: phase times, the flat per-step metrics of the event log, and the problem records.

Besides rewards, ratings and solve rates, a step reports what its proposals looked like, per task type
(``task/<name>/...``) and over the teachers (``teacher/...``): proposals cut off by ``propose_max_tokens``
(finish reason "length"), distinct valid problems (by the task's ``problem_key``), proposer prompt lengths in
tokens, and ``token_nll``, the mean negative log-probability of the sampled proposal tokens under
the model's raw distribution (the engine's per-token log-probs; engines report no full distributions). At
temperature 1 and top_p 1 it is an unbiased estimate of the teachers' mean per-token entropy; otherwise the
cross-entropy of the sampling distribution with the model's.

Optional task members feed it (:class:`~populora_core.api.components.Task`): ``proposer`` (what the teacher
makes of a proposal), ``proposer_metrics(contexts)`` and ``problem_metrics(problems)``, logged as
``task/<name>/<key>``, and ``teacher_metrics``, the keys of ``Problem.metrics`` averaged per teacher. The loop
reads no problem's payload: ``tasks/problems.jsonl`` records it as the task's problem type declares it, and the
task's own fields as its ``record_fields`` writes them (:func:`problem_records`).

A task that declares ``difficulty_levels`` reports each valid problem's level through ``difficulty(problem)``,
and every step logs (:func:`difficulty_metrics`) ``member/<teacher>/difficulty``, the mean level of the valid
proposals that teacher wrote, ``teacher/difficulty`` over all teachers', and
``member/<student>/solve_rate_at_level/<L>``, the mean solve rate of the student on the valid proposals of level
L it answered as matched student (None where it answered none): the paper's dynamics, teachers pushing
difficulty up and students' solve rates moving per level. With two tasks or more declaring levels each key
takes the task's name after the member (``member/<id>/<task>/difficulty``, ``teacher/<task>/difficulty``);
with one it takes none.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from ..api.components import Completion, Match, MatchOutcome, Rollout, payload_fields
from ..api.errors import PluginError
from ..api.population import Population
from .proposals import Proposal

#: Phases whose time is model compute; everything else counts as orchestration.
MODEL_PHASES = ("generate_propose", "generate_solve", "generate_buffer", "train")


class PhaseTimer:
    """Wall seconds per named phase of one step (a phase may be entered several times)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def metrics(self, total: float, children: int) -> dict[str, Any]:
        """``time/<phase>``, the step's total and the share of it that was not model compute."""
        model_s = sum(self.seconds[p] for p in MODEL_PHASES)
        return {
            **{f"time/{k}": v for k, v in self.seconds.items()},
            "time/step": total,
            "time/orchestration_share": max(total - model_s, 0.0) / total,
            "evolution/children": children,
        }


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def authors_problem(task: Any) -> bool:
    """Whether a task's teachers write its whole problems (its declared ``proposer``; AZR induction's do not)."""
    return bool(task.proposer.authors_problem)


def _token_nll(completions: Iterable[Completion]) -> float | None:
    """Token-weighted mean negative log-prob of the sampled completion tokens (None without log-probs).

    ``math.fsum`` rounds once, so the figure does not depend on the order the completions came back in (a
    call split across workers returns them in another order than one process)."""
    logprobs = [lp for c in completions for lp in c.logprobs]
    return -math.fsum(logprobs) / len(logprobs) if logprobs else None


def proposal_metrics(tasks: Mapping[str, Any], proposals: Sequence[Proposal]) -> dict[str, Any]:
    """What the step's proposals looked like, per task type and over the teachers (see the module docstring)."""
    m: dict[str, Any] = {}
    written = [p for p in proposals if authors_problem(tasks.get(p.task))]
    for task_name, task in tasks.items():
        mine = [p for p in proposals if p.task == task_name]
        completions = [p.completion for p in mine if p.completion is not None]
        generated = [c for c in completions if not c.dropped]
        valid = [p.problem for p in mine if p.valid and p.problem is not None]
        cut = sum(c.finish_reason == "length" for c in generated)
        prompt_tokens = [len(c.prompt_token_ids) for c in completions]
        m[f"task/{task_name}/proposals"] = len(mine)
        m[f"task/{task_name}/valid_proposals"] = len(valid)
        m[f"task/{task_name}/not_generated"] = len(completions) - len(generated)
        m[f"task/{task_name}/cut_off"] = cut
        m[f"task/{task_name}/cut_off_rate"] = cut / len(generated) if generated else None
        m.update({f"task/{task_name}/{k}": v for k, v in task.problem_metrics(valid).items()})
        m[f"task/{task_name}/distinct_signatures"] = len({p.signature for p in valid if p.signature})
        m[f"task/{task_name}/token_nll"] = _token_nll(generated)
        m[f"task/{task_name}/prompt_tokens"] = _mean(prompt_tokens)
        m[f"task/{task_name}/prompt_tokens_max"] = max(prompt_tokens, default=None)
        m.update({f"task/{task_name}/{k}": v for k, v in task.proposer_metrics([p.ctx for p in mine]).items()})
    generated_all = [p.completion for p in proposals if p.completion is not None and not p.completion.dropped]
    m["teacher/cut_off"] = sum(c.finish_reason == "length" for c in generated_all)
    m["teacher/token_nll"] = _token_nll(generated_all)
    m["teacher/distinct_problems"] = len(
        {(p.task, tasks[p.task].problem_key(p.problem)) for p in written if p.valid and p.problem is not None}
    )
    return m


def difficulty_metrics(
    tasks: Mapping[str, Any], population: Population, matches: Sequence[Match], proposals: Sequence[Proposal]
) -> dict[str, Any]:
    """Teachers' proposal difficulty and students' solve rate per level (see the module docstring); nothing for
    tasks without ``difficulty_levels``. Levels come from the task's ``difficulty``, never from a payload."""
    graded = {name: task for name, task in tasks.items() if task.difficulty_levels}
    student_of = {x.teacher: x.student for x in matches}
    m: dict[str, Any] = {}
    for task_name, task in graded.items():
        scope = f"{task_name}/" if len(graded) > 1 else ""
        levels = tuple(task.difficulty_levels)
        rated = []  # (teacher, matched student, level, solve rate) of the task's valid proposals with a level
        for p in proposals:
            if p.task != task_name or p.problem is None or not p.problem.valid:
                continue
            level = task.difficulty(p.problem)
            if level is None:
                continue
            if level not in levels:
                raise PluginError(f"task {task_name!r}: difficulty {level!r} is not one of its levels {levels}")
            rated.append((p.teacher.id, student_of.get(p.teacher.id), level, p.solve_rate))
        m[f"teacher/{scope}difficulty"] = _mean([lv for _, _, lv, _ in rated])
        for teacher in population.teachers:
            m[f"member/{teacher.id}/{scope}difficulty"] = _mean([lv for t, _, lv, _ in rated if t == teacher.id])
        for student in population.students:
            for level in levels:
                rates = [r for _, s, lv, r in rated if s == student.id and lv == level and r is not None]
                m[f"member/{student.id}/{scope}solve_rate_at_level/{level}"] = _mean(rates)
    return m


def step_metrics(
    step: int,
    population: Population,
    coverage: dict[str, set[str]],
    tasks: Mapping[str, Any],
    matches: list[Match],
    outcomes: list[MatchOutcome],
    proposals: list[Proposal],
    rollouts: list[Rollout],
    train_stats: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The flat dict of one step: per member, per teacher, per task type, per match, and overall."""
    m: dict[str, Any] = {"step": step, "matches": [[x.teacher, x.student] for x in matches]}
    teacher_keys = list(dict.fromkeys(key for task in tasks.values() for key in task.teacher_metrics))
    for member in population.members.values():
        prefix = f"member/{member.id}"
        m[f"{prefix}/version"] = member.version
        m[f"{prefix}/reward"] = _mean([r.reward for r in rollouts if r.member_id == member.id])
        m[f"{prefix}/rating_mu"] = member.rating.mu
        m[f"{prefix}/rating_sigma"] = member.rating.sigma
        m.update({f"{prefix}/counters/{k}": v for k, v in asdict(member.counters).items()})
        stats = train_stats.get(member.id, {})
        m.update({f"{prefix}/train/{k}": v for k, v in stats.items() if isinstance(v, (int, float))})
    for member in population.students:
        solved = [r.info["correct"] for r in rollouts if r.member_id == member.id and "correct" in r.info]
        m[f"member/{member.id}/solve_rate"] = _mean(solved)
        m[f"member/{member.id}/coverage"] = len(coverage[member.id])
    for teacher in population.teachers:
        mine = [p for p in proposals if p.teacher.id == teacher.id]
        valid = [p.problem for p in mine if p.valid and p.problem is not None]
        m[f"member/{teacher.id}/validity"] = len(valid) / len(mine) if mine else None
        # the tasks' teacher metrics of the problems the teacher wrote (AZR: deduction and abduction, not induction)
        own = [p.problem for p in mine if p.valid and p.problem is not None and authors_problem(tasks.get(p.task))]
        for key in teacher_keys:
            m[f"member/{teacher.id}/{key}"] = _mean([p.metrics[key] for p in own if key in p.metrics])
        m[f"member/{teacher.id}/token_nll"] = _token_nll(
            p.completion for p in mine if p.completion is not None and not p.completion.dropped
        )
    for task_name in tasks:
        mine = [p for p in proposals if p.task == task_name]
        m[f"task/{task_name}/validity"] = sum(p.valid for p in mine) / len(mine) if mine else None
    m.update(proposal_metrics(tasks, proposals))
    m.update(difficulty_metrics(tasks, population, matches, proposals))
    for o in outcomes:
        m[f"match/{o.teacher}-{o.student}/solve_rate"] = o.solve_rate
    m["solve_rate"] = _mean([r.info["correct"] for r in rollouts if "correct" in r.info])
    m["validity"] = sum(p.valid for p in proposals) / len(proposals) if proposals else None
    return m


def problem_records(
    step: int, proposals: list[Proposal], student_of: dict[str, Match], tasks: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """One ``tasks/problems.jsonl`` record per proposal, valid or not (loadable with ``datasets``).

    The problem's payload fields (those its task's :class:`~populora_core.api.components.Problem` subclass adds,
    in declaration order) come after ``proposer_version``, the task's own fields (its ``record_fields``) after the
    loop's keys and before ``metric_*``; neither may take the name of a record key, nor the task's fields a
    payload field's (a :class:`~populora_core.api.errors.PluginError`). ``finish_reason`` is the completion's
    ("length": cut off by ``propose_max_tokens``)."""
    records = []
    for proposal in proposals:
        p = proposal.problem
        assert p is not None, "problem records are written after validation"
        completion = proposal.completion
        payload = payload_fields(p)
        own = tasks[proposal.task].record_fields(p)
        for what, clash in (
            (f"its problem type {type(p).__qualname__} has payload fields", payload.keys() & RECORD_KEYS),
            ("its record_fields has fields", own.keys() & (RECORD_KEYS | payload.keys())),
        ):
            if clash:
                raise PluginError(
                    f"task {proposal.task!r}: {what} named like problem record keys or payload fields "
                    f"({', '.join(sorted(clash))}); rename them"
                )
        head = {"step": step, "task_type": proposal.task, "proposer": proposal.teacher.id}
        head["proposer_version"] = p.proposer
        tail = {
            "valid": p.valid,
            "error": p.error or "",
            "matched_student": student_of[proposal.teacher.id].student,
            "solve_rate": proposal.solve_rate,
            "signature": p.signature,
            "finish_reason": completion.finish_reason if completion is not None else None,
            "completion_tokens": len(completion.token_ids) if completion is not None else None,
        }
        records.append({**head, **payload, **tail, **own, **{f"metric_{k}": v for k, v in p.metrics.items()}})
    return records


#: The keys of a problem record besides the payload's, the task's own and ``metric_*``.
RECORD_KEYS = frozenset(
    "step task_type proposer proposer_version valid error matched_student solve_rate signature finish_reason "
    "completion_tokens".split()
)
