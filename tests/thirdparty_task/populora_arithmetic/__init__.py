"""A third-party task that is not about code: "What is 17 + 25?" -> "42".

Teachers propose questions, students answer, and the task checks answers exactly with its own arithmetic (no
executor). Its problems are :class:`ArithmeticProblem`, its own payload (``question``, ``answer``) on the core's
:class:`Problem`; it imports only ``populora_core.api`` and registers through the ``register_tasks`` hook.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from populora_core.api import Params, hookimpl
from populora_core.api.components import Grade, Problem, Task

OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
QUESTION = re.compile(r"What is (\d{1,4}) ([-+*]) (\d{1,4})\?")


@dataclass
class ArithmeticProblem(Problem):
    """The task's payload: a question and its exact answer (an integer, as text)."""

    question: str
    answer: str


def exact_answer(question: str) -> str:
    """The answer of a well-formed question; ``ValueError`` for anything else."""
    match = QUESTION.fullmatch(question.strip())
    if match is None:
        raise ValueError(f"not an arithmetic question: {question!r}")
    a, op, b = match.groups()
    return str(OPERATORS[op](int(a), int(b)))


class ArithmeticParams(Params):
    """Rewards of the arithmetic task."""

    wrong_reward: float = Field(0.0, description="reward of a wrong but well-formed answer")
    invalid_reward: float = Field(-1.0, description="a teacher's reward for a question it did not pose properly")


class ArithmeticTask(Task[ArithmeticProblem]):
    name = "arithmetic"
    problem_type = ArithmeticProblem

    def __init__(self, params: ArithmeticParams) -> None:
        self.params = params
        self.buffer: list[ArithmeticProblem] = [
            ArithmeticProblem(self.name, "What is 17 + 25?", "42", valid=True, proposer="seed")
        ]

    def load_problem(self, record: Mapping[str, Any]) -> ArithmeticProblem:
        """The schema's fields, and an answer that is the question's exact answer (the task's own verifier)."""
        problem = super().load_problem(record)
        if exact_answer(problem.question) != problem.answer.strip():
            raise ValueError(f"answer {problem.answer!r} is not {exact_answer(problem.question)!r}")
        return problem

    def proposer_prompts(self, count: int, rng: Any) -> list[tuple[str, Any]]:
        out = []
        for _ in range(count):
            example = self.buffer[rng.randrange(len(self.buffer))]
            out.append((f"Question: {example.question}\nWrite a new question like it.\nQuestion:", example.question))
        return out

    def parse_proposals(
        self, completions: Sequence[str], contexts: Sequence[Any], proposer: Sequence[str]
    ) -> list[ArithmeticProblem]:
        problems = []
        for text, who in zip(completions, proposer, strict=True):
            question = text.strip().splitlines()[0].strip() if text.strip() else ""
            try:
                answer, error = exact_answer(question), None
            except ValueError as exc:
                answer, error = "", str(exc)
            problems.append(
                ArithmeticProblem(self.name, question, answer, valid=error is None, error=error, proposer=who)
            )
        return problems

    def solver_prompt(self, problem: ArithmeticProblem) -> str:
        return f"Question: {problem.question}\nAnswer:"

    def grade(self, problem: ArithmeticProblem, answers: Sequence[str]) -> list[Grade]:
        grades = []
        for text in answers:
            given = text.strip().split()[0] if text.strip() else ""
            formatted = bool(re.fullmatch(r"-?\d+", given))
            correct = given == problem.answer
            grades.append(Grade(1.0 if correct else self.params.wrong_reward, correct, formatted))
        return grades

    def proposer_reward(self, problem: ArithmeticProblem, solve_rate: float | None) -> float:
        if solve_rate is None:
            return self.params.invalid_reward
        return 1.0 - solve_rate if 0.0 < solve_rate < 1.0 else 0.0

    def problem_metrics(self, problems: Sequence[ArithmeticProblem]) -> dict[str, Any]:
        return {"distinct_questions": len({p.question for p in problems})}

    def add_to_buffer(self, problems: Sequence[ArithmeticProblem]) -> None:
        self.buffer += [p for p in problems if p.task_type == self.name and p.valid]

    def sample_problems(self, count: int, rng: Any) -> list[ArithmeticProblem]:
        return list(reversed(self.buffer))[:count]

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": [(p.question, p.answer, p.proposer) for p in self.buffer]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer = [ArithmeticProblem(self.name, q, a, valid=True, proposer=who) for q, a, who in state["buffer"]]


def _arithmetic(params: ArithmeticParams) -> ArithmeticTask:
    """Arithmetic questions with exact answers, checked without an executor."""
    return ArithmeticTask(params)


@hookimpl
def register_tasks(register: Any) -> None:
    register("arithmetic", _arithmetic, params=ArithmeticParams)
