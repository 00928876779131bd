"""The ``arith`` task: teachers write addition questions, students answer them least significant digit first.

Everything is checked here, exactly, with integer arithmetic: no program runs, so the task needs no executor.
A proposal is the first line of the completion up to ``;``; anything outside the grammar of :mod:`.world` is
invalid with its reason counted (``task/arith/invalid/<reason>``), never an error. Rewards follow AZR's: a
student gets ``solver_correct`` / ``solver_wrong`` (digits, but not the answer) / ``solver_format``; a teacher
the learnability ``1 - r`` of its valid question, ``unsolved_reward`` at r = 0, ``solved_reward`` at r = 1,
``invalid_reward`` for a question outside the grammar.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from populora_core.api.components import Grade, Problem, Task

from . import world


@dataclass
class ArithProblem(Problem):
    """``a+b`` (``question``: what the teacher wrote, kept for an invalid one too); its level (difficulty) is in
    ``metrics["level"]``, its shape (level and carried columns) in ``signature``."""

    question: str
    a: int
    b: int


class ArithTask(Task[ArithProblem]):
    name = "arith"
    problem_type = ArithProblem
    difficulty_levels = world.LEVELS

    def __init__(self, params: Any, rng: Any) -> None:
        self.params = params
        seed_rng = rng if isinstance(rng, random.Random) else random.Random(rng)
        self.buffer: list[ArithProblem] = [
            self._problem(*world.draw(lv, seed_rng), proposer="seed")
            for lv in params.seed_levels
            for _ in range(params.seed_per_level)
        ]
        self._invalid: Counter[str] = Counter()

    def _problem(self, a: int, b: int, proposer: str) -> ArithProblem:
        return ArithProblem(
            self.name,
            world.question(a, b),
            a,
            b,
            valid=True,
            proposer=proposer,
            metrics={"level": world.level(a, b)},
            signature=f"L{world.level(a, b)}:{world.carries(a, b)}",
        )

    def difficulty(self, problem: ArithProblem) -> int:
        return int(problem.metrics.get("level") or world.level(problem.a, problem.b))

    def load_problem(self, record: Mapping[str, Any]) -> ArithProblem:
        """A record with ``a`` and ``b`` (``question`` optional, and then it must say the same), in the grammar."""
        record = dict(record)
        a, b = record.get("a"), record.get("b")
        if not isinstance(a, int) or not isinstance(b, int) or isinstance(a, bool) or isinstance(b, bool):
            raise TypeError("a and b must be integers")
        if a < 0 or b < 0:
            raise ValueError("operands must be non-negative")
        world.parse_question(world.question(a, b))
        written = record.setdefault("question", world.question(a, b))
        if written != world.question(a, b):
            raise ValueError(f"question {written!r} is not {world.question(a, b)!r}")
        problem = super().load_problem(record)
        return self._problem(problem.a, problem.b, problem.proposer or "file")

    def problem_key(self, problem: ArithProblem) -> tuple[int, int]:
        return (problem.a, problem.b)

    def proposer_prompts(self, count: int, rng: Any) -> list[tuple[str, Any]]:
        out = []
        for _ in range(count):
            k = rng.randint(1, self.params.references)
            refs = [self.buffer[rng.randrange(len(self.buffer))] for _ in range(k)]
            pairs = [(p.a, p.b) for p in refs]
            out.append((world.proposer_prompt(pairs), [world.level(a, b) for a, b in pairs]))
        return out

    def parse_proposals(
        self, completions: Sequence[str], contexts: Sequence[Any], proposer: Sequence[str]
    ) -> list[ArithProblem]:
        problems = []
        for text, who in zip(completions, proposer, strict=True):
            line = text.split(world.PROPOSAL_STOP)[0].strip()
            try:
                a, b = world.parse_question(line)
            except ValueError as exc:
                self._invalid[str(exc)] += 1
                problems.append(ArithProblem(self.name, line[:40], 0, 0, valid=False, error=str(exc), proposer=who))
                continue
            problems.append(self._problem(a, b, who))
        return problems

    def solver_prompt(self, problem: ArithProblem) -> str:
        return world.solver_prompt(problem.a, problem.b)

    def grade(self, problem: ArithProblem, answers: Sequence[str]) -> list[Grade]:
        p, right, grades = self.params, world.answer(problem.a, problem.b), []
        for text in answers:
            given = text.strip()
            formatted = given.isdigit()
            correct = given == right
            reward = p.solver_correct if correct else (p.solver_wrong if formatted else p.solver_format)
            grades.append(Grade(reward, correct, formatted))
        return grades

    def proposer_reward(self, problem: ArithProblem, solve_rate: float | None) -> float:
        p = self.params
        if solve_rate is None:
            return p.invalid_reward
        if solve_rate <= 0.0:
            return p.unsolved_reward
        if solve_rate >= 1.0:
            return p.solved_reward
        return 1.0 - solve_rate

    def proposer_metrics(self, contexts: Sequence[Any]) -> dict[str, Any]:
        shown = [lv for levels in contexts for lv in levels]
        out: dict[str, Any] = {"reference_level": sum(shown) / len(shown) if shown else None}
        out.update({f"invalid/{reason}": n for reason, n in sorted(self._invalid.items())})
        self._invalid.clear()
        return out

    def problem_metrics(self, problems: Sequence[ArithProblem]) -> dict[str, Any]:
        levels = Counter(world.level(p.a, p.b) for p in problems)
        return {f"proposals_at_level/{lv}": levels.get(lv, 0) for lv in world.LEVELS}

    def add_to_buffer(self, problems: Sequence[ArithProblem]) -> None:
        self.buffer += [p for p in problems if p.valid]

    def sample_problems(self, count: int, rng: Any) -> list[ArithProblem]:
        return list(reversed(self.buffer))[:count]

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": [[p.a, p.b, p.proposer] for p in self.buffer]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer = [self._problem(a, b, who) for a, b, who in state["buffer"]]
