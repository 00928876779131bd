"""AZR's code tasks (deduction, abduction, induction) as PopuLoRA task components.

Faithful to Absolute Zero Reasoner's task semantics with its released bugs fixed by default;
``compat: azr-released`` restores the released behaviour where it differs (see README.md).
"""

from __future__ import annotations

import warnings
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from populora_core.api import Params, hookimpl

from .checks import DEFAULT_BANNED_ATTRIBUTES, DEFAULT_BANNED_BUILTINS


class AZRTaskParams(Params):
    """Settings shared by the three AZR tasks; defaults are AZR's where we do not fix a bug."""

    style: Literal["azr", "compact"] = Field(
        "azr", description="prompt style: AZR's R1-style structure, or short prompts for a tiny model"
    )
    compat: Literal["fixed", "azr-released"] = Field(
        "fixed", description="'azr-released' reproduces AZR's released quirks (see README)"
    )
    one_def: bool = Field(
        True,
        description="reject programs with more than one function (AZR reject_multiple_functions, which its "
        "Llama and Qwen3-4B scripts turn off); fixed counts top-level functions, azr-released every def, "
        "nested and methods too",
    )
    f_replace_location: Literal["not_first", "any_first", "any_last", "not_last"] | None = Field(
        None,
        description="which function is renamed to f (AZR f_replace_location): not_first / not_last: always the "
        "first / last; any_first / any_last: none if one is already called f, else the first / last. fixed "
        "looks at top-level functions, azr-released at every def (methods, nested). None: any_first (fixed), "
        "not_first (azr-released, AZR's default); AZR's Llama and Qwen3-4B scripts use any_last",
    )
    banned: tuple[str, ...] | None = Field(
        None, description="banned modules/names; None: AZR's 16 (azr-released) or those plus os, sys, ... (fixed)"
    )
    banned_builtins: tuple[str, ...] = Field(
        DEFAULT_BANNED_BUILTINS, description="builtins a program may not use (fixed only)"
    )
    banned_attributes: tuple[str, ...] = Field(
        DEFAULT_BANNED_ATTRIBUTES, description="interpreter internals a program may not touch (fixed only)"
    )
    buffer_cap: int = Field(16384, ge=1, description="most problems a buffer holds (AZR max_programs)")
    eviction: Literal["oldest", "reject_new"] | None = Field(
        None,
        description="when full: evict the oldest non-seed ('oldest', fixed default) or drop new "
        "problems ('reject_new', AZR released)",
    )
    max_output_chars: int = Field(
        1000,
        ge=16,
        description="largest accepted repr of an output (and input text); fixed rejects larger, "
        "azr-released truncates to 400 instead",
    )
    max_program_chars: int = Field(6000, ge=16, description="largest accepted program text")
    allow_none_output: bool | None = Field(
        None, description="accept programs returning None; None: no (fixed) / yes (azr-released)"
    )
    timeout_s: float = Field(10.0, gt=0, description="per-program time limit (AZR execute_max_timeout)")
    memory_mb: int | None = Field(None, ge=16, description="per-program memory limit; None: executor default")
    solver_correct: float = 1.0
    solver_wrong: float = -0.5
    solver_format: float = Field(-1.0, description="solver reward when the answer format is broken")
    unsolved_reward: float = Field(
        -0.5,
        ge=-1,
        le=1,
        description="proposer reward when the matched student solves none of its samples, r = 0 (AZR released "
        "-0.5; the paper's Eq. 4 says 0)",
    )
    solved_reward: float = Field(
        -0.5,
        ge=-1,
        le=1,
        description="proposer reward when the matched student solves every sample, r = 1 (AZR released -0.5; "
        "the paper's Eq. 4 says 0)",
    )
    invalid_reward: float = Field(-1.0, description="proposer reward for an invalid or unformatted proposal")
    compact_max_chars: int = Field(
        600,
        ge=200,
        description="compact induction solver prompts leave out example pairs beyond this many characters (at "
        "least one is shown); proposer prompts have their own budget, proposer_max_chars",
    )
    compute_metrics: bool = Field(True, description="AST depth, cyclomatic complexity, LOC, shape signature")


class CodeIOParams(AZRTaskParams):
    """Deduction and abduction settings."""

    references: int = Field(6, ge=0, description="K reference triplets per proposer prompt (AZR io_n)")
    references_fit: Literal["all", "skip_long"] = Field(
        "all",
        description="all: the K drawn references are shown whatever their length (AZR); a compact prompt over "
        "proposer_max_chars is shown whole and counted (task/<name>/references/over_budget). skip_long: compact "
        "prompts skip references that would pass proposer_max_chars, which favours short programs (PopuLoRA "
        "before issue 32; for ablations)",
    )
    proposer_max_chars: int = Field(
        900,
        ge=200,
        validate_default=True,
        description="the longest compact proposer prompt, in characters, the model handles: 900 for nano, which "
        "keeps its deduction validity with 3-4 references shown and loses it with 6 (see README)",
    )

    @field_validator("proposer_max_chars")
    @classmethod
    def _budget_holds_the_references(cls, value: int, info: ValidationInfo) -> int:
        """Whether the compact budget holds K references: not even of the zero triplet's size is an error with
        ``all`` (every prompt would overflow) and a warning with ``skip_long`` (K is never shown); not of a typical
        size (:data:`prompts.TYPICAL_REFERENCE`) a warning (most prompts will be over it, and counted)."""
        from .prompts import TYPICAL_REFERENCE, ZERO_TRIPLET, compact_proposer_chars

        k = info.data.get("references")
        if info.data.get("style") != "compact" or not isinstance(k, int):
            return value

        def most(ref: tuple[str, str, str]) -> int:
            return max(n for n in range(k + 1) if compact_proposer_chars([ref] * n) <= value)

        need = compact_proposer_chars([ZERO_TRIPLET] * k)
        typical = compact_proposer_chars([TYPICAL_REFERENCE] * k)
        skip = info.data.get("references_fit") == "skip_long"
        if need > value and not skip:
            fits = most(ZERO_TRIPLET)
            raise ValueError(
                f"{value} characters cannot hold references: {k} (even {k} references of the zero triplet's size "
                f"need {need}); raise proposer_max_chars to at least {need}, or lower references to {fits}"
            )
        if typical > value:
            fits = most(TYPICAL_REFERENCE)
            what = (
                "references_fit skip_long leaves the others out, favouring short programs"
                if skip
                else "longer prompts are shown whole and counted in task/<name>/references/over_budget"
            )
            warnings.warn(
                f"proposer_max_chars {value} holds about {fits} of references: {k} typical compact references "
                f"(90-character programs; {k} need {typical} characters): {what}. Lower references to {fits}, or "
                "raise proposer_max_chars if the model handles longer prompts",
                stacklevel=2,
            )
        return value


class InductionParams(AZRTaskParams):
    """Induction settings."""

    n_inputs: int = Field(10, ge=2, description="inputs per proposal; the first half is shown, the rest hidden")


def _deduction(params: CodeIOParams, *, executor, rng):
    """AZR deduction (code_o): predict the output of a program on an input."""
    from .code_io import DeductionTask

    return DeductionTask(params, executor=executor, rng=rng)


def _abduction(params: CodeIOParams, *, executor, rng):
    """AZR abduction (code_i): give an input that makes a program return a given output."""
    from .code_io import AbductionTask

    return AbductionTask(params, executor=executor, rng=rng)


def _induction(params: InductionParams, *, executor, rng, tasks=None):
    """AZR induction (code_f): write the program from input/output pairs and a message; it draws programs
    from the deduction/abduction tasks in ``tasks`` (the run's tasks by name)."""
    from .induction import InductionTask

    return InductionTask(params, executor=executor, rng=rng, tasks=tasks)


@hookimpl
def register_tasks(register):
    register("deduction", _deduction, params=CodeIOParams)
    register("abduction", _abduction, params=CodeIOParams)
    register("induction", _induction, params=InductionParams)
