"""The per-step ``Proposal``: one teacher's proposal as it moves through a step (the loop's own record)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api.components import Completion, Problem
from ..api.population import Member


@dataclass
class Proposal:
    """One teacher's proposal as it moves through a step: prompted, generated, validated, then solved."""

    task: str
    teacher: Member
    ctx: Any  # what the task's proposer prompt referenced (handed back to ``parse_proposals``)
    completion: Completion | None = None
    problem: Problem | None = None
    solve_rate: float | None = None  # the matched student's; None while unsolved or invalid

    @property
    def valid(self) -> bool:
        return self.problem is not None and self.problem.valid
