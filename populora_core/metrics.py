"""What a step reports: phase times, the flat per-step metrics of the event log, and the problem records."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from .components import Match, MatchOutcome, Rollout
from .population import Population
from .problems import Proposal

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


def step_metrics(
    step: int,
    population: Population,
    coverage: dict[str, set[str]],
    task_names: Iterable[str],
    matches: list[Match],
    outcomes: list[MatchOutcome],
    proposals: list[Proposal],
    rollouts: list[Rollout],
    train_stats: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The flat dict of one step: per member, per teacher, per task type, per match, and overall."""
    m: dict[str, Any] = {"step": step, "matches": [[x.teacher, x.student] for x in matches]}
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
        for key in ("ast_depth", "cyclomatic", "loc"):
            m[f"member/{teacher.id}/{key}"] = _mean([p.metrics[key] for p in valid if key in p.metrics])
    for task_name in task_names:
        mine = [p for p in proposals if p.task == task_name]
        m[f"task/{task_name}/validity"] = sum(p.valid for p in mine) / len(mine) if mine else None
    for o in outcomes:
        m[f"match/{o.teacher}-{o.student}/solve_rate"] = o.solve_rate
    m["solve_rate"] = _mean([r.info["correct"] for r in rollouts if "correct" in r.info])
    m["validity"] = sum(p.valid for p in proposals) / len(proposals) if proposals else None
    return m


def problem_records(step: int, proposals: list[Proposal], student_of: dict[str, Match]) -> list[dict[str, Any]]:
    """One ``tasks/problems.jsonl`` record per proposal, valid or not (loadable with ``datasets``)."""
    records = []
    for proposal in proposals:
        p = proposal.problem
        assert p is not None, "problem records are written after validation"
        records.append(
            {
                "step": step,
                "task_type": proposal.task,
                "proposer": proposal.teacher.id,
                "proposer_version": p.proposer,
                "program": p.program,
                "inputs": p.inputs,
                "outputs": p.outputs,
                "message": p.message,
                "valid": p.valid,
                "error": p.error or "",
                "matched_student": student_of[proposal.teacher.id].student,
                "solve_rate": proposal.solve_rate,
                "signature": p.signature,
                **{f"metric_{k}": v for k, v in p.metrics.items()},
            }
        )
    return records
