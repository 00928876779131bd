"""AZR's problems: a program with inputs and outputs (and, for induction, the proposer's message).

:class:`CodeProblem` is the payload schema of the three AZR tasks (their ``problem_type``): the fields their
prompts and grading read, after the core's :class:`~populora_core.api.components.Problem` fields. A record of
``tasks/problems.jsonl`` or of a problem file holds them between the proposer and the validity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from populora_core.api.components import Problem, problem_from_record


@dataclass
class CodeProblem(Problem):
    """An AZR problem: ``program`` (defines ``f``), its ``inputs`` and ``outputs`` (Python literals as text, one
    output per input) and the induction proposer's ``message``. Built like the core's Problem was:
    ``CodeProblem("deduction", program, inputs, outputs, valid=True)``."""

    program: str
    inputs: list[str]
    outputs: list[str]
    message: str = ""


def load_code_problem(record: Mapping[str, Any]) -> CodeProblem:
    """A :class:`CodeProblem` from a problem file's record, each field checked against its type, with at least one
    input and one output per input (as AZR grades it); ``ValueError`` saying what does not fit."""
    problem = problem_from_record(CodeProblem, record)
    assert isinstance(problem, CodeProblem)
    if not problem.inputs or len(problem.inputs) != len(problem.outputs):
        raise ValueError("a problem needs as many outputs as inputs, at least one")
    return problem


class CodeProblemReader:
    """Reads AZR problem records without building a task (``load_problems``' reader): a probe set, a curriculum."""

    def load_problem(self, record: Mapping[str, Any]) -> CodeProblem:
        return load_code_problem(record)
