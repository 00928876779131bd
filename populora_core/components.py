"""What each component kind must provide (Protocols) and the plain data passed between them.

The loop only talks to components through these contracts, so any stage can be swapped by a
recipe or a third-party plugin. No torch import here.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

# --- models and adapters --------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseModel:
    """A resolved base model: a local directory (or hub id on machines with a hub) and its dtype."""

    path: str
    name: str = ""
    dtype: str = "auto"  # "auto" = float32 on CPU, bfloat16 on GPU
    chat_template: bool = False  # AZR feeds raw text; True wraps prompts in the tokenizer's template
    probe_path: str = ""  # a held-out probe set (JSONL of Problem records) shipped with the model, if any


#: Every attention and MLP projection of a Llama/Qwen-style decoder: the recipe's ``lora.target_modules`` default.
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    """Shape of every adapter in a population (kept equal so operators stay consistent)."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES
    init_std: float = 0.0  # >0: B starts with this noise instead of zeros (PEFT's B = 0 default)


@dataclass(frozen=True)
class AdapterRef:
    """One immutable adapter version: ``name`` like ``s0@v3`` and its PEFT directory."""

    name: str
    path: str

    @property
    def served_key(self) -> str:
        """What engines cache a version by: its name and resolved path. Two runs in one process both have
        an ``s0@v3``; a name alone would serve the first run's weights to the second."""
        return f"{self.name} ({Path(self.path).resolve()})"


# --- generation -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    max_prompt_tokens: int | None = None  # longer prompts get no generation (finish_reason "prompt_too_long")
    logprobs: bool = False  # per-token log-probs in Completion.logprobs (else []): only a trainer that reads them


#: Finish reasons of a request the engine did not generate for: the loop trains on none of them.
DROPPED = ("prompt_too_long", "error")


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    adapter: AdapterRef | None = None  # None: the base model alone
    # the request's position in the whole logical call when a caller split one call into parts (a cluster
    # spreading generation over workers); None: its position in this call. A row-seeded engine seeds by it.
    index: int | None = None


def split_by_cost(costs: Sequence[float], parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` ranges of ``costs``, at most ``parts`` and none empty, each near an equal
    share of the total (a call's requests over workers, or over parallel decode runs).

    A row goes to the part that holds the middle of its cost; a middle exactly on a boundary goes to the
    earlier part (``<=``: either choice is equally even, this one is the hf engine's, whose runs it keeps).
    """
    total, bounds, running, start = sum(costs), [], 0.0, 0
    for part in range(1, parts):
        goal = total * part / parts
        end = start
        while end < len(costs) and running + costs[end] / 2 <= goal:
            running += costs[end]
            end += 1
        if end > start:
            bounds.append((start, end))
            start = end
    if start < len(costs):
        bounds.append((start, len(costs)))
    return bounds


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    logprobs: list[float]  # per generated token under the sampling policy, when SamplingParams.logprobs
    prompt_token_ids: list[int]
    finish_reason: str = "stop"  # "stop" | "length" | one of DROPPED (then text "" and no tokens)

    @property
    def dropped(self) -> bool:
        return self.finish_reason in DROPPED


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        """``sampling.n`` completions per request, in request order; mixed adapters in one batch.

        A request the engine cannot serve (prompt over ``sampling.max_prompt_tokens``, or rejected) gets
        ``n`` completions with a :data:`DROPPED` finish reason; it never fails the other requests.

        An engine may declare ``row_seeded = True``: each request's completions then depend only on
        ``sampling.seed``, the request's index (``GenerationRequest.index``, else its position in the call),
        the sample index and the adapter, never on the other requests of the call. Only then may a cluster
        split one call across workers and still get exactly what the single process gets.
        """
        ...

    def sleep(self) -> None:
        """The trainer needs the device now: release what the engine can re-create (KV cache, weights copy);
        the next ``generate`` wakes it. A no-op for an engine that shares the trainer's weights."""
        ...

    def close(self) -> None: ...


# --- training -------------------------------------------------------------------------------------


@dataclass
class Rollout:
    """One scored completion of one member: what a trainer learns from."""

    member_id: str
    group: str  # advantage-normalisation group, e.g. "deduction/solve" (AZR: task type x role)
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    reward: float
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, member_id: str, group: str, completion: Completion, reward: float, **info: Any) -> Rollout:
        """The rollout of one engine completion: its tokens and sampling logprobs, scored with ``reward``."""
        return cls(
            member_id, group, completion.prompt_token_ids, completion.token_ids, completion.logprobs, reward, info
        )


@dataclass
class UpdateStats:
    loss: float = 0.0
    grad_norm: float = 0.0
    entropy: float = 0.0
    tokens: int = 0
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class UpdateJob:
    """One member's policy update, as :meth:`Trainer.update` takes it: a value so many can be handed over at once."""

    member_id: str
    adapter: AdapterRef
    rollouts: Sequence[Rollout]
    out_dir: Path


@runtime_checkable
class Trainer(Protocol):
    """One policy update per member and step, from the member's current version to a new one.

    A trainer may also provide ``update_many(jobs: list[UpdateJob]) -> list[UpdateStats]`` (stats in job order):
    the loop then hands it the whole step's updates at once, so it can run members in parallel (a cluster
    trains the members each worker owns, all workers at once); without it the loop calls :meth:`update` per member.
    """

    #: True when ``update`` reads ``Rollout.logprobs`` (the sampling policy's): the loop then asks engines for them.
    needs_sampling_logprobs: bool

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
    checkpoint. The checkpoint layout is :mod:`populora_core.trainer_state`'s manifest plus one file per member."""

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


@dataclass
class ExecResult:
    """Outcome of one sandboxed program. ``status``: ok | error | timeout | memory | killed | output_too_large."""

    status: str
    value: str | None = None  # repr of the evaluated expression when status == "ok"
    stdout: str = ""
    error: str | None = None  # "ExceptionType: message" for status == "error"
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class ExecJob:
    """A program to run: ``code`` as a module, then ``expr`` evaluated in its namespace (repr returned).

    ``timeout_s``/``memory_mb`` override the executor's defaults for this job. ``hash_variant`` picks
    an interpreter family with its own ``PYTHONHASHSEED`` (and random state): every job runs in a fresh
    process, but processes of one family share str/bytes hash order. For AZR's determinism check, run
    the same job once with ``hash_variant=0`` and once with ``hash_variant=1`` in one ``run_batch``
    and compare the two ``value``s; set/dict-order dependence then shows up as a difference.
    """

    code: str
    expr: str | None = None
    timeout_s: float | None = None
    memory_mb: int | None = None
    hash_variant: int = 0


@runtime_checkable
class Executor(Protocol):
    def run_batch(self, jobs: Sequence[ExecJob]) -> list[ExecResult]:
        """Run many programs in parallel; never raises for anything a program does."""
        ...

    def close(self) -> None: ...


@dataclass
class Problem:
    """A proposed problem after parsing and validation (valid or not), with its program metrics."""

    task_type: str
    program: str
    inputs: list[str]
    outputs: list[str]
    message: str = ""
    valid: bool = False
    error: str | None = None  # why it is invalid
    proposer: str = ""  # adapter version name that proposed it
    metrics: dict[str, Any] = field(default_factory=dict)  # ast_depth, cyclomatic, loc
    signature: str = ""  # normalised shape hash for problem-space coverage


@dataclass
class Grade:
    reward: float
    correct: bool
    formatted: bool


@runtime_checkable
class Task(Protocol):
    """One task type (AZR: deduction, abduction, induction): prompts, validation, grading, buffer."""

    name: str

    def proposer_prompts(self, count: int, rng: Any) -> list[tuple[str, Any]]:
        """``count`` proposer prompts with their context (references used), drawn from the buffer."""
        ...

    def parse_proposals(
        self, completions: Sequence[str], contexts: Sequence[Any], proposer: Sequence[str]
    ) -> list[Problem]:
        """Parse and validate (in the executor) one proposal per completion."""
        ...

    def solver_prompt(self, problem: Problem) -> str: ...

    def grade(self, problem: Problem, answers: Sequence[str]) -> list[Grade]:
        """Check solver answers in the executor; never evaluates model text in this process."""
        ...

    def proposer_reward(self, problem: Problem, solve_rate: float | None) -> float:
        """Learnability reward of a proposal from the matched solver's solve rate (None: invalid)."""
        ...

    def add_to_buffer(self, problems: Sequence[Problem]) -> None: ...

    def sample_problems(self, count: int, rng: Any) -> list[Problem]:
        """Problems for solver training, recent first (AZR's ``max_new``)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


# --- population dynamics ------------------------------------------------------------------------------


@dataclass
class Match:
    teacher: str
    student: str
    expected_solve_rate: float = 0.5


@dataclass
class MatchOutcome:
    teacher: str
    student: str
    solve_rate: float | None  # None: the teacher produced no valid problem
    expected_solve_rate: float = 0.5


@runtime_checkable
class Matchmaker(Protocol):
    def pair(self, teachers: Sequence[Any], students: Sequence[Any], rng: Any) -> list[Match]: ...

    def update_ratings(self, outcomes: Sequence[MatchOutcome], members: dict[str, Any]) -> None:
        """Update ``member.rating`` of the members involved from the match outcomes."""
        ...

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint must keep beyond the members' ratings (``None``: nothing)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (called only when it was not ``None``)."""
        ...


@dataclass
class Replacement:
    """``dead`` leaves; a child of ``parents`` (survivor ids, best first) takes its place.

    ``operator`` empty: the loop draws one from the recipe's operator mix (a crossover needs two
    parents); ``mutation_only``: draw among mutations only (PBT's "mutate in place" tier, where
    ``parents == [dead]``).
    """

    dead: str
    parents: list[str]
    operator: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    mutation_only: bool = False


@runtime_checkable
class Selector(Protocol):
    """Which members of one sub-population die, and whose children replace them.

    ``ready``: ids of the members that may be replaced (they have lived ``evolution.ready_after`` steps, PBT's
    readiness); the others still rank and may be parents. A selector whose ``select`` does not take ``ready``
    is called without it, and the loop refuses any replacement of a member that is not ready.
    """

    def select(self, members: Sequence[Any], rng: Any, ready: Collection[str] | None = None) -> list[Replacement]: ...


@runtime_checkable
class Cluster(Protocol):
    """Where the heavy components run (recipe ``cluster``): built before the engine and the trainer, it builds
    them on its workers so they can share them, and hands back driver-side objects with their contracts.
    The run itself (population, ratings, RNG streams, checkpoints) stays in the driver. ``local`` (no
    cluster object) is the single process."""

    def engine(self, name: str, params: dict[str, Any], context: dict[str, Any]) -> RolloutEngine:
        """The recipe's engine ``name`` with raw ``params``, on the workers; ``context``: its factory's arguments."""
        ...

    def trainer(self, name: str, params: dict[str, Any], context: dict[str, Any]) -> Trainer:
        """The recipe's trainer ``name`` with raw ``params``, on the workers."""
        ...

    def close(self) -> None:
        """Release every worker and reservation (called once, when the run ends or fails)."""
        ...


@runtime_checkable
class MetricSink(Protocol):
    def emit(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


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
