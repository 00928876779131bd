"""The task contract: what one task type provides (prompts, validation, grading, its buffer, its problems' schema).
:mod:`.components` exports it beside the other Protocols.
No torch import here.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from .records import Grade, Problem, payload_fields, problem_from_record

#: A task's own :class:`Problem` subclass (its payload schema): ``Task[MyProblem]`` types a task's members by it.
ProblemT = TypeVar("ProblemT", bound=Problem)


@dataclass(frozen=True)
class ProposerCapabilities:
    """What a task's teacher makes of a proposal: data the task declares (:attr:`Task.proposer`), read by the loop.

    ``authors_problem``: whether the teacher writes the whole problem. False for a task whose proposals take part
    of their problem from elsewhere (AZR's induction: the program, from the deduction/abduction buffers); the loop
    then leaves its proposals out of what it reports about the problems teachers wrote (``teacher/distinct_problems``
    and the per-teacher ``teacher_metrics``)."""

    authors_problem: bool = True


@runtime_checkable
class Task(Protocol[ProblemT]):
    """One task type (AZR: deduction, abduction, induction): prompts, validation, grading, buffer. A task subclasses
    this class to inherit the defaults of its optional members (``problem_type``, ``load_problem``,
    ``problem_key``, ``problem_metrics``, ``teacher_metrics``, ``difficulty_levels``, ``difficulty``,
    ``grade_many``, ``proposer``, ``record_fields``, ``proposer_metrics``).

    A task need not be about code: its problems are its own :class:`Problem` subclass (``problem_type``, the
    payload schema), and the loop reads none of their payload. What it needs of a problem it asks the task: the
    identity of a problem (``problem_key``), the step's numbers about its proposals (``problem_metrics``,
    ``teacher_metrics``), its difficulty (``difficulty``, one of ``difficulty_levels``), and a problem from a
    file's record (``load_problem``).
    """

    name: str
    #: What the teacher makes of a proposal (:class:`ProposerCapabilities`); by default the whole problem
    proposer: ProposerCapabilities = ProposerCapabilities()
    #: The dataclass of this task's problems: :class:`Problem` plus the task's payload fields, its schema. The
    #: payload fields are what ``tasks/problems.jsonl`` records of a problem and what a problem file must hold
    #: (JSON values: strings, numbers, lists, dicts). Default: :class:`Problem`, no payload.
    problem_type: type[Problem] = Problem
    #: Keys of ``Problem.metrics`` the loop averages per teacher over the valid problems it wrote, logged as
    #: ``member/<id>/<key>`` (AZR: ast_depth, cyclomatic, loc); none by default.
    teacher_metrics: tuple[str, ...] = ()
    #: The levels this task's problems can have, easiest first (``populora_arith``: the digits of the longer
    #: operand, 1-6). With levels, the loop logs every step each teacher's mean proposal difficulty and each
    #: student's solve rate per level (:mod:`populora_core.run.metrics`): whether teachers push difficulty up and
    #: where students learn. Empty (the default): the task reports no difficulty.
    difficulty_levels: tuple[int, ...] = ()

    def difficulty(self, problem: ProblemT) -> int | None:
        """The level of a valid problem, one of :attr:`difficulty_levels` (the loop refuses another value with a
        ``PluginError``); None: this problem has none. Asked only of a task with levels; None by default."""
        return None

    def load_problem(self, record: Mapping[str, Any]) -> ProblemT:
        """A problem of this task from one record of a problem file (seeds, a probe set, a curriculum); raise
        ``ValueError`` or ``TypeError`` saying why a record does not fit (the caller names the file, line and
        task). The default builds :attr:`problem_type` from the record's fields, each checked against its type
        (:func:`~populora_core.api.records.problem_from_record`); a task overrides it to check more."""
        return problem_from_record(self.problem_type, record)  # type: ignore[return-value]

    def problem_key(self, problem: ProblemT) -> Hashable:
        """What makes two problems of this task the same problem: seeding keeps one of each, a probe set one of
        each. The default: the payload, every field the task added to :class:`Problem`."""
        return json.dumps(payload_fields(problem), sort_keys=True)

    def record_fields(self, problem: ProblemT) -> dict[str, Any]:
        """The task's own fields of a problem's record in ``tasks/problems.jsonl``, written after the loop's keys
        and before ``metric_*`` (AZR: ``teacher_program``, whether the teacher wrote the program). JSON values; a
        name may not be a record key or a payload field (a ``PluginError``). None by default."""
        return {}

    def problem_metrics(self, problems: Sequence[ProblemT]) -> dict[str, Any]:
        """What the task reports about a step's valid proposals of its type (AZR: mean input length, distinct
        programs), logged as ``task/<name>/<key>``; nothing by default."""
        return {}

    def proposer_prompts(self, count: int, rng: Any) -> list[tuple[str, Any]]:
        """``count`` proposer prompts with their context (references used), drawn from the buffer."""
        ...

    def parse_proposals(
        self, completions: Sequence[str], contexts: Sequence[Any], proposer: Sequence[str]
    ) -> list[ProblemT]:
        """Parse and validate (in the executor) one proposal per completion."""
        ...

    def solver_prompt(self, problem: ProblemT) -> str: ...

    def grade(self, problem: ProblemT, answers: Sequence[str]) -> list[Grade]:
        """Check solver answers in the executor; never evaluates model text in this process."""
        ...

    def grade_many(self, items: Sequence[tuple[ProblemT, Sequence[str]]]) -> list[list[Grade]]:
        """The grades of many ``(problem, answers)`` at once, in order: what the loop calls, so a task can check a
        whole step's answers in one executor batch. The default grades one problem at a time."""
        return [self.grade(problem, answers) for problem, answers in items]

    def proposer_metrics(self, contexts: Sequence[Any]) -> dict[str, Any]:
        """What the task reports about its proposer prompts (AZR: the references shown), logged per step as
        ``task/<name>/<key>``; nothing by default."""
        return {}

    def proposer_reward(self, problem: ProblemT, solve_rate: float | None) -> float:
        """Learnability reward of a proposal from the matched solver's solve rate (None: invalid)."""
        ...

    def add_to_buffer(self, problems: Sequence[ProblemT]) -> None: ...

    def sample_problems(self, count: int, rng: Any) -> list[ProblemT]:
        """Problems for solver training, recent first (AZR's ``max_new``)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (buffers, counters): JSON data only (dicts, lists, strings, numbers, booleans,
        None), written as ``tasks/<name>.json``; a checkpoint is data, never code."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s data as read back from JSON (tuples as lists); it comes from a run directory
        on disk, so check it (``ValueError``/``TypeError`` on what does not fit: the resume is refused)."""
        ...
