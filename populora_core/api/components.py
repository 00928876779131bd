"""What each component kind must provide (Protocols), with the plain data passed between them (:mod:`.records`)
and the task contract (:mod:`.tasks`): this module exports all three, so a plugin imports every contract from here.

The loop only talks to components through these contracts, so any stage can be swapped by a
recipe or a third-party plugin. No torch import here.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

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
)
from .tasks import ProblemT, ProposerCapabilities, Task

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
    "ProblemT",
    "ProposerCapabilities",
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
    "problem_from_record",
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
        (:func:`populora_core.services.adapters.served_copy`, which trainers write beside the fp32 version) instead
        of the version itself; a Ray cluster then ships only that copy to it. None (the default): it reads the
        version."""
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
    checkpoint. The checkpoint layout is :mod:`populora_core.services.trainer_state`'s manifest plus one file per
    member."""

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


# --- execution ----------------------------------------------------------------------------


@runtime_checkable
class Executor(Protocol):
    def run_batch(self, jobs: Sequence[ExecJob]) -> list[ExecResult]:
        """Run many programs in parallel; never raises for anything a program does."""
        ...

    def close(self) -> None:
        """Stop worker processes (called once, when the run ends); nothing to stop by default."""
        return None


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

    ``category`` says what its answers are ("code": programs, graded in the executor it is handed, never
    in-process; "math": answers checked as text); the core reads it not, and which averages a score enters is
    the evaluating plugin's (``populora_evals``' groups). Items are plain dicts with an ``id``.
    """

    name: str
    category: str
    max_tokens: int
    #: The prompt template the prompts are written in: part of what an evaluation's results and cache are keyed by
    #: (another template is another result). Default: "" (the evaluator has one way to write a prompt).
    template: str = ""

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
