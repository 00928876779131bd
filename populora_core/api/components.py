"""What each component kind must provide (Protocols), with the plain data passed between them (:mod:`.records`).

The loop only talks to components through these contracts, so any stage can be swapped by a
recipe or a third-party plugin. No torch import here.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from .population import Rating
from .records import (
    DEFAULT_TARGET_MODULES,
    DROPPED,
    PROBLEM_FIELDS,
    AdapterRef,
    BaseModel,
    Completion,
    ExecJob,
    ExecResult,
    GenerationRequest,
    Grade,
    LoraSettings,
    Match,
    MatchOutcome,
    Problem,
    Replacement,
    Rollout,
    SamplingParams,
    UpdateJob,
    UpdateStats,
    payload_fields,
    problem_from_record,
    split_by_cost,
)

T = TypeVar("T")
#: A task's own :class:`Problem` subclass (its payload schema): ``Task[MyProblem]`` types a task's members by it.
ProblemT = TypeVar("ProblemT", bound=Problem)

__all__ = [
    "DEFAULT_TARGET_MODULES",
    "DROPPED",
    "PROBLEM_FIELDS",
    "AdapterRef",
    "BaseModel",
    "Cluster",
    "Completion",
    "Evaluator",
    "ExecJob",
    "ExecResult",
    "Executor",
    "GenerationRequest",
    "Grade",
    "LoraSettings",
    "Match",
    "MatchOutcome",
    "Matchmaker",
    "MemberStateTrainer",
    "MetricSink",
    "Problem",
    "Replacement",
    "Rollout",
    "RolloutEngine",
    "SamplingParams",
    "Selector",
    "Task",
    "Trainer",
    "UpdateJob",
    "UpdateStats",
    "payload_fields",
    "per_task",
    "problem_from_record",
    "split_by_cost",
]

# --- generation -----------------------------------------------------------------------------------


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates completions for mixed-adapter batches. An engine subclasses this class to inherit the defaults
    of its optional capabilities (``row_seeded``, ``served_dtype``, ``close``)."""

    @property
    def row_seeded(self) -> bool:
        """True when each request's completions depend only on ``sampling.seed``, the request's index
        (``GenerationRequest.index``, else its position in the call), the sample index and the adapter, never on
        the other requests of the call. Only then may a cluster split one call across workers and still get
        exactly what the single process gets. False by default."""
        return False

    @property
    def served_dtype(self) -> str | None:
        """The 16-bit dtype this engine serves adapters in when it reads a version's copy in it
        (:func:`populora_core.api.adapters.served_copy`, which trainers write beside the fp32 version) instead of the
        version itself; a Ray cluster then ships only that copy to it. None (the default): it reads the version."""
        return None

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        """``sampling.n`` completions per request, in request order; mixed adapters in one batch.

        A request the engine cannot serve (prompt over ``sampling.max_prompt_tokens``, or rejected) gets
        ``n`` completions with a :data:`DROPPED` finish reason; it never fails the other requests.
        """
        ...

    def sleep(self) -> None:
        """The trainer needs the device now: release what the engine can re-create (KV cache, weights copy);
        the next ``generate`` wakes it. A no-op for an engine that shares the trainer's weights."""
        ...

    def close(self) -> None:
        """Release processes and memory (called once, when the run ends); nothing to release by default."""
        return None


# --- training -------------------------------------------------------------------------------------


@runtime_checkable
class Trainer(Protocol):
    """One policy update per member and step, from the member's current version to a new one. A trainer
    subclasses this class to inherit the defaults of its optional capabilities (``needs_sampling_logprobs``,
    ``algorithm``, ``update_many``)."""

    @property
    def needs_sampling_logprobs(self) -> bool:
        """True when ``update`` reads ``Rollout.logprobs`` (the sampling policy's): the loop then asks engines
        for them. False by default."""
        return False

    #: the policy-gradient algorithm's name (a Ray worker reports it; empty: the registered trainer name)
    algorithm: str = ""

    def update_many(self, jobs: Sequence[UpdateJob]) -> list[UpdateStats]:
        """The whole step's updates (stats in job order): the loop always calls this. The default runs
        :meth:`update` per member in turn; a trainer overrides it to run members in parallel (a cluster trains
        the members each worker owns, all workers at once)."""
        return [self.update(job.member_id, job.adapter, job.rollouts, job.out_dir) for job in jobs]

    def update(self, member_id: str, adapter: AdapterRef, rollouts: Sequence[Rollout], out_dir: Path) -> UpdateStats:
        """One policy update of ``member_id`` from ``adapter``; writes the new version to ``out_dir``."""
        ...

    def copy_state(self, source_member: str, target_member: str) -> None:
        """Give ``target_member`` a copy of ``source_member``'s optimizer state (PBT inheritance)."""
        ...

    def forget(self, member_id: str) -> None:
        """Drop a member's optimizer state (it left the population)."""
        ...

    def save_state(self, directory: Path) -> None: ...

    def load_state(self, directory: Path) -> None: ...


@runtime_checkable
class MemberStateTrainer(Trainer, Protocol):
    """A trainer whose optimizer state moves member by member: what a cluster needs to spread members over
    workers, move a member (a child bred on another worker) and save or load each worker's share of a
    checkpoint. The checkpoint layout is :mod:`populora_core.api.trainer_state`'s manifest plus one file per member."""

    def members(self) -> list[str]:
        """Members that have state, sorted."""
        ...

    def export_member(self, member_id: str) -> Any:
        """A picklable copy of one member's state (None: it has none), for :meth:`import_member` elsewhere."""
        ...

    def import_member(self, member_id: str, state: Any) -> None:
        """Take a state :meth:`export_member` made (None: forget the member)."""
        ...

    def save_members(self, directory: Path, member_ids: Sequence[str]) -> dict[str, str]:
        """Write these members' states, one file each, under ``directory``; returns member -> relative path."""
        ...

    def load_members(self, directory: Path, files: dict[str, str]) -> None:
        """Load the members in ``files`` (member -> path relative to ``directory``, from the manifest)."""
        ...


# --- execution and tasks ----------------------------------------------------------------------------


@runtime_checkable
class Executor(Protocol):
    def run_batch(self, jobs: Sequence[ExecJob]) -> list[ExecResult]:
        """Run many programs in parallel; never raises for anything a program does."""
        ...

    def close(self) -> None:
        """Stop worker processes (called once, when the run ends); nothing to stop by default."""
        return None


@runtime_checkable
class Task(Protocol[ProblemT]):
    """One task type (AZR: deduction, abduction, induction): prompts, validation, grading, buffer. A task subclasses
    this class to inherit the defaults of its optional members (``problem_type``, ``load_problem``,
    ``problem_key``, ``problem_metrics``, ``teacher_metrics``, ``difficulty_levels``, ``difficulty``,
    ``grade_many``, ``proposer_writes_program``, ``proposer_metrics``).

    A task need not be about code: its problems are its own :class:`Problem` subclass (``problem_type``, the
    payload schema), and the loop reads none of their payload. What it needs of a problem it asks the task: the
    identity of a problem (``problem_key``), the step's numbers about its proposals (``problem_metrics``,
    ``teacher_metrics``), its difficulty (``difficulty``, one of ``difficulty_levels``), and a problem from a
    file's record (``load_problem``).
    """

    name: str
    #: False for a task whose proposals carry a program the teacher did not write (AZR's induction: from a pool);
    #: those are left out of the teachers' program metrics
    proposer_writes_program: bool = True
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


# --- population dynamics ------------------------------------------------------------------------------


@runtime_checkable
class Matchmaker(Protocol):
    def pair(self, teachers: Sequence[Any], students: Sequence[Any], rng: Any) -> list[Match]:
        """Exactly one :class:`Match` per teacher, its student one of ``students`` (a student may have several
        teachers, or none). The loop checks it: two matches for a teacher, or none, is a PluginError."""
        ...

    def update_ratings(self, outcomes: Sequence[MatchOutcome], members: dict[str, Any]) -> None:
        """Update ``member.rating`` of the members involved from the match outcomes."""
        ...

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint must keep beyond the members' ratings (``None``: nothing)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (called only when it was not ``None``)."""
        ...

    def prior(self) -> Rating:
        """A new member's first rating on this matchmaker's scale, a new object each call: every member of a new
        run, and a child under ``evolution.child_rating: fresh`` (a widened child's sigma is capped at its sigma).
        TrueSkill's prior by default (:data:`populora_core.api.population.PRIOR_MU`, ``PRIOR_SIGMA``)."""
        return Rating()


@runtime_checkable
class Selector(Protocol):
    """Which members of one sub-population die, and whose children replace them.

    ``ready``: ids of the members that may be replaced (they have played ``evolution.ready_after`` rated matches,
    PBT's readiness); the others still rank and may be parents. A selector whose ``select`` does not take ``ready``
    is called without it, and the loop refuses any replacement of a member that is not ready.
    """

    def select(self, members: Sequence[Any], rng: Any, ready: Collection[str] | None = None) -> list[Replacement]: ...

    def survivors(self, n: int) -> int | None:
        """Of a sub-population of ``n``, the most members one selection can replace by another member's child,
        subtracted from ``n``: the lines it keeps. The recipe's validation refuses fewer than 2 (every role would
        fall back to one lineage); None (the default): unknown, not checked."""
        return None


@runtime_checkable
class Cluster(Protocol):
    """Where the heavy components run (recipe ``cluster``): built before the engine and the trainer, it builds
    them on its workers so they can share them, and hands back driver-side objects with their contracts.
    The run itself (population, ratings, RNG streams, checkpoints) stays in the driver. ``local`` (no
    cluster object) is the single process."""

    def engine(self, name: str, params: dict[str, Any], context: dict[str, Any]) -> RolloutEngine:
        """The recipe's engine ``name`` with its ``params`` (as the recipe's validation parsed them), on the workers;
        ``context``: its factory's arguments."""
        ...

    def trainer(self, name: str, params: dict[str, Any], context: dict[str, Any]) -> Trainer:
        """The recipe's trainer ``name`` with its ``params`` (as parsed), on the workers."""
        ...

    def gpu_bytes(self) -> int | None:
        """Memory of one of the GPUs the workers use (the smallest), for the plan that resolves an engine's
        ``auto`` settings; None: no GPU, or not known (the default)."""
        return None

    def close(self) -> None:
        """Release every worker and reservation (called once, when the run ends or fails)."""
        ...


@runtime_checkable
class MetricSink(Protocol):
    def emit(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None:
        """Flush and close (called once, when the run ends); nothing to close by default."""
        return None


# --- evaluation -------------------------------------------------------------------------------------


@runtime_checkable
class Evaluator(Protocol):
    """One benchmark: its problems, the prompt for each, and the grading of completions.

    ``category`` ("code" or "math") decides which AZR average a score enters. Items are plain dicts
    with an ``id``. Code benchmarks grade in the executor they are handed (never in-process).
    """

    name: str
    category: str
    max_tokens: int

    def items(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The benchmark's problems in a fixed order (the first ``limit``); bad data raises UserError."""
        ...

    def dataset_hash(self) -> str:
        """sha256 identifying the data the items came from (results and caches record it)."""
        ...

    def prompt(self, item: dict[str, Any]) -> str: ...

    def stop(self) -> tuple[str, ...]:
        """Stop strings for generation (nothing after them is graded)."""
        ...

    def grade(
        self, items: Sequence[dict[str, Any]], completions: Sequence[Sequence[str]], executor: Executor | None = None
    ) -> list[list[bool]]:
        """Correctness of each completion of each item (same shape as ``completions``)."""
        ...


def per_task(
    tasks: Mapping[str, Task], task_names: Sequence[str | None], batch: Callable[[Task, list[int]], Sequence[T]]
) -> list[T]:
    """``batch(task, indices)`` once per task over the indices of its items (``None``: no task, left out),
    tasks in the order first met; the results come back in input order (a left-out item's is None)."""
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, task_name in enumerate(task_names):
        if task_name is not None:
            by_task[task_name].append(i)
    out: list[T] = [None] * len(task_names)  # type: ignore[list-item]
    for task_name, idx in by_task.items():
        for i, result in zip(idx, batch(tasks[task_name], idx), strict=True):
            out[i] = result
    return out
