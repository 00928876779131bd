"""The plain data passed between components and the loop: requests, completions, rollouts, problems, matches.

Values only (dataclasses, and LoraSettings, which the recipe validates; no behaviour beyond small helpers);
:mod:`.components` re-exports every name, so a plugin imports them from there beside the Protocols. No torch
import here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, fields
from pathlib import Path
from typing import Any

from pydantic import BaseModel as Schema
from pydantic import ConfigDict, Field, TypeAdapter

# --- models and adapters --------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseModel:
    """A resolved base model: a local directory (or hub id on machines with a hub) and its dtype."""

    path: str
    name: str = ""
    dtype: str = "auto"  # "auto" = float32 on CPU, bfloat16 on GPU
    chat_template: bool = False  # AZR feeds raw text; True wraps prompts in the tokenizer's template
    probe_path: str = ""  # a held-out probe set (JSONL of Problem records) shipped with the model, if any
    #: What ``populora eval`` runs on this base when ``--benchmarks`` is not given: evaluator names, ``name:N`` for
    #: the first N problems. Empty: the evaluator plugin's own default. A model too small to score on the paper's
    #: benchmarks names a set it can be measured on (nano: its held-out problems and a few code problems).
    eval_benchmarks: tuple[str, ...] = ()


#: Every attention and MLP projection of a Llama/Qwen-style decoder: the recipe's ``lora.target_modules`` default.
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraSettings(Schema):
    """Shape of every adapter in a population (kept equal so operators stay consistent): the recipe's ``lora``
    section, validated there, and what engines and trainers are built with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(16, ge=1, description="LoRA rank r of every adapter (operators may change a child's)")
    alpha: float = Field(32.0, gt=0, description="LoRA alpha; the update is scaled by alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout while training (the fused forward needs 0)")
    target_modules: tuple[str, ...] = Field(
        DEFAULT_TARGET_MODULES, description="the base's linear modules that get LoRA"
    )
    init_std: float = Field(
        0.0, ge=0, description="[choice] >0 gives fresh adapters noise in B so weight-space operators act at step 0"
    )


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


@dataclass
class Problem:
    """A proposed problem after parsing and validation (valid or not): what every task's problems have.

    The task owns the rest, its payload: a task subclasses this dataclass with the fields its prompts and grading
    read (AZR's code tasks: program, inputs, outputs, message; an arithmetic task: a question and its answer) and
    names the subclass as :attr:`Task.problem_type <populora_core.api.components.Task.problem_type>`. Only
    ``task_type`` is positional here, so a subclass's own fields come next in its constructor, before these.
    The core never reads a payload field: it writes them into ``tasks/problems.jsonl`` and reads them back from
    problem files through :func:`payload_fields` and the task's ``load_problem``, and asks the task whatever
    else it needs of a problem (its identity, what a step's proposals looked like).
    """

    task_type: str
    _: KW_ONLY
    valid: bool = False
    error: str | None = None  # why it is invalid
    proposer: str = ""  # adapter version name that proposed it
    #: numbers the task measured on the problem (AZR: ast_depth, cyclomatic, loc); ``metric_<key>`` in its record
    metrics: dict[str, Any] = field(default_factory=dict)
    signature: str = ""  # normalised shape hash for problem-space coverage


#: The fields of :class:`Problem` itself; a subclass's other fields are its task's payload.
PROBLEM_FIELDS = tuple(f.name for f in fields(Problem))


def payload_fields(problem: Problem) -> dict[str, Any]:
    """The task-owned fields of ``problem`` (those its :class:`Problem` subclass adds), in declaration order: what
    its record in ``tasks/problems.jsonl`` holds between the proposer and the validity."""
    return {f.name: getattr(problem, f.name) for f in fields(problem) if f.name not in PROBLEM_FIELDS}


_VALIDATORS: dict[Any, TypeAdapter[Any]] = {}


def _validator(problem_type: Any) -> TypeAdapter[Any]:
    """One validator per problem type (building one costs more than a record's validation)."""
    if problem_type not in _VALIDATORS:
        _VALIDATORS[problem_type] = TypeAdapter(problem_type)
    return _VALIDATORS[problem_type]


def problem_from_record(problem_type: type[Problem], record: Mapping[str, Any]) -> Problem:
    """A ``problem_type`` from a JSON record (a line of a problem file or of ``tasks/problems.jsonl``): the fields
    it declares, each checked against its annotation; keys it does not declare (the step, ``metric_*``) are left
    out. Raises ``ValueError`` (pydantic's ``ValidationError``) naming each field that is missing or of the wrong
    type: the record does not fit the task's schema."""
    names = {f.name for f in fields(problem_type)}
    problem: Problem = _validator(problem_type).validate_python({k: v for k, v in record.items() if k in names})
    return problem


@dataclass
class Grade:
    reward: float
    correct: bool
    formatted: bool


# --- population dynamics ------------------------------------------------------------------------------


@dataclass
class Match:
    teacher: str
    student: str
    expected_solve_rate: float = 0.5


@dataclass
class MatchOutcome:
    """``problem_rates``: per proposal the teacher generated, its student's solve rate, None where it gave no
    usable problem (invalid, or every answer dropped); empty when only the mean ``solve_rate`` is known."""

    teacher: str
    student: str
    solve_rate: float | None  # mean over the valid problems; None: the teacher produced no valid problem
    expected_solve_rate: float = 0.5
    problem_rates: list[float | None] = field(default_factory=list)


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
