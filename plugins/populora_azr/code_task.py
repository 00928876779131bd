"""What AZR's three code tasks share (:class:`AZRTask`): a program's and an input's static checks, the jobs that
compute gold outputs, grading in one executor batch, the proposer's reward, the buffer and the task's state. The
tasks themselves are :mod:`.code_io` (deduction: predict the output; abduction: an input) and :mod:`.induction`
(the program).

Every program, model answer and comparison runs in the executor the task is given; this process only
parses text (``ast``) and, for gold outputs already produced by the executor, ``ast.literal_eval``.

Two behaviours, chosen by ``compat``:

* ``fixed`` (default): AST-enforced banned names; a program is valid only if two runs in two fresh
  processes with different hash seeds agree (each run also calls ``f`` twice), nothing raises, ``f``
  returns something other than ``None``, and the output is plain literal data (checked inside the
  sandbox) whose repr fits ``max_output_chars``; answers are compared inside the sandbox with ``==`` on
  plain data, so a solver cannot pass by returning an object whose ``__eq__`` always says yes, and an
  abduction answer must be exactly the arguments of one call of ``f``.
* ``azr-released``: AZR's released behaviour, quirks included (imports-only banned check, regex def
  count and rename, one in-process determinism check that lets programs raising exceptions without "error" in the
  message through with output ``''``, outputs truncated to 400 characters, deduction's ``eval`` fast
  path, answers pasted into the check as raw code). The comparisons still run in the sandbox.
"""

from __future__ import annotations

import ast
import statistics
import tokenize
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from populora_core.api.components import ExecJob, ExecResult, Grade, Task

from . import checks, prompts
from .buffer import ProblemBuffer, as_random
from .problems import CodeProblem, load_code_problem
from .sandbox_code import COMPAT_HELPERS, FIXED_HELPERS, azr_truncate, safe_literal


@dataclass
class Prepared:
    """A proposal or answer after the static checks: jobs to run, or why it failed already."""

    error: str | None = None
    jobs: list[ExecJob] = field(default_factory=list)
    payload: Any = None


class AZRTask(Task[CodeProblem]):
    """Shared parts of the three tasks (checks, job building, grading, rewards, state)."""

    name = ""
    problem_type = CodeProblem
    #: the program metrics the loop averages per teacher (over the programs it wrote)
    teacher_metrics = ("ast_depth", "cyclomatic", "loc")

    def __init__(self, params: Any, *, executor: Any, rng: Any) -> None:
        self.params = params
        self.executor = executor
        self.rng = as_random(rng if rng is not None else 0)
        self.compat = params.compat == "azr-released"
        self.style = params.style
        if params.banned is not None:
            self.banned = tuple(params.banned)
        else:
            self.banned = checks.AZR_BANNED if self.compat else checks.AZR_BANNED + checks.EXTRA_BANNED
        eviction = params.eviction or ("reject_new" if self.compat else "oldest")
        self.buffer = ProblemBuffer(self.zero_problems(), cap=params.buffer_cap, eviction=eviction)
        self.allow_none = params.allow_none_output if params.allow_none_output is not None else self.compat
        self.f_replace_location = params.f_replace_location or ("not_first" if self.compat else "any_first")

    # subclasses
    def zero_problems(self) -> list[CodeProblem]:
        """What the buffer holds before any proposal (AZR's zero triplet; seed problems come on top)."""
        raise NotImplementedError

    # --- execution helpers -------------------------------------------------------------------------------

    def _job(self, code: str, expr: str, hash_variant: int = 0) -> ExecJob:
        return ExecJob(
            code=code,
            expr=expr,
            timeout_s=self.params.timeout_s,
            memory_mb=self.params.memory_mb,
            hash_variant=hash_variant,
        )

    def _run(self, prepared: Sequence[Prepared]) -> list[list[ExecResult]]:
        """Run every prepared item's jobs in one batch; results grouped per item."""
        jobs = [j for p in prepared for j in p.jobs]
        refused = {i for i, j in enumerate(jobs) if self.compat and "input(" in j.code + (j.expr or "")}
        runnable = [j for i, j in enumerate(jobs) if i not in refused]
        ran = iter(self.executor.run_batch(runnable) if runnable else [])
        # AZR's executor refuses any code containing the substring "input(" (answers and checks too)
        results = [
            ExecResult(status="error", error="RuntimeError: input( is not allowed") if i in refused else next(ran)
            for i in range(len(jobs))
        ]
        if next(ran, None) is not None:
            raise RuntimeError(f"executor returned more results than the {len(runnable)} jobs it was given")
        out, i = [], 0
        for p in prepared:
            out.append(list(results[i : i + len(p.jobs)]))
            i += len(p.jobs)
        return out

    # --- static checks on a program ------------------------------------------------------------------------

    def check_program(self, program: str) -> tuple[str | None, str]:
        """``(error, program)``: the program after the one-def rule and renaming one function to ``f``
        (``f_replace_location``: among top-level functions, identifiers only (fixed), or among every
        ``def`` AZR's regex sees, with its regex replace (azr-released))."""
        p = self.params
        if len(program) > p.max_program_chars:
            return f"program longer than {p.max_program_chars} characters", program
        try:
            tree = ast.parse(program)
        except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
            return f"syntax: {type(exc).__name__}: {exc}", program
        if self.compat:
            bad = checks.azr_banned_violations(tree, self.banned)
            if bad:
                return "banned: " + "; ".join(bad), program
            if "input(" in program:  # AZR's executor refuses any code containing this substring
                return "banned: the code contains 'input('", program
            names = checks.azr_def_names(program)
            if not names:
                return "no function definition", program
            if p.one_def and len(names) > 1:
                return f"{len(names)} function definitions (one_def counts nested defs and methods)", program
            return None, checks.azr_rename_def(program, self.f_replace_location)
        bad = checks.banned_violations(tree, self.banned, p.banned_builtins, p.banned_attributes)
        bad += reserved_names(tree)
        if bad:
            return "banned: " + "; ".join(bad), program
        tops = checks.top_level_functions(tree)
        if not tops:
            return "no top-level function definition", program
        if p.one_def and len(tops) > 1:
            return f"{len(tops)} top-level functions (one_def allows one)", program
        target = checks.f_replace_target(tops, self.f_replace_location)
        if target is not None:
            try:
                program = checks.rename_identifier(program, target, "f")
            except (SyntaxError, ValueError, tokenize.TokenError) as exc:  # tokenize can disagree with ast
                return f"syntax: {exc}", program
        return None, program

    def check_args(self, args: str) -> tuple[str | None, str]:
        """``(error, call expression)`` for an input: the arguments of exactly one call of ``f``."""
        if len(args) > self.params.max_output_chars:
            return f"input longer than {self.params.max_output_chars} characters", ""
        if self.compat:
            return None, f"f({args})"
        try:
            tree = checks.call_of_f(args)
            call = ast.unparse(tree)
        except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
            return f"input: {exc}", ""
        bad = checks.banned_violations(
            tree, self.banned, self.params.banned_builtins, self.params.banned_attributes
        ) + reserved_names(tree)
        if bad:
            return "banned in input: " + "; ".join(bad), ""
        return None, call

    def output_jobs(self, program: str, call: str) -> list[ExecJob]:
        """Jobs computing the gold output of ``call``: two fresh processes (fixed) or one (compat)."""
        if self.compat:
            return [self._job(program + "\n" + COMPAT_HELPERS, f"_azr_twice(lambda: {call})")]
        code = program + "\n" + FIXED_HELPERS
        expr = f"_populora_value(lambda: {call})"
        return [self._job(code, expr, 0), self._job(code, expr, 1)]

    def output_from(self, results: Sequence[ExecResult]) -> tuple[str | None, str]:
        """``(error, output)`` from the results of :meth:`output_jobs`."""
        if self.compat:
            r = results[0]
            if r.status == "ok":
                return None, azr_truncate(r.value or "")
            if r.status == "error" and "error" not in (r.error or "").lower():
                return None, ""  # AZR's validity test looks for "error" in the status text
            return f"{r.status}: {r.error or ''}".strip(), ""
        for r in results:
            if r.status != "ok":
                return f"{r.status}: {r.error or ''}".strip(), ""
        values = [r.value or "" for r in results]
        if len(set(values)) > 1:
            return "non-deterministic: two fresh processes returned different outputs", ""
        value = values[0]
        if len(value) > self.params.max_output_chars:
            return f"output longer than {self.params.max_output_chars} characters", ""
        ok, obj = safe_literal(value)
        if not ok:
            return "output is not a literal", ""
        if obj is None and not self.allow_none:
            return "f returned None", ""
        return None, value

    # --- grading -----------------------------------------------------------------------------------------

    def _formatted(self, completion: str) -> bool:
        if self.style == "compact":
            return prompts.has_answer_block(self.name, completion, self.style)
        return prompts.check_format(completion, self.style)

    def grade(self, problem: CodeProblem, answers: Sequence[str]) -> list[Grade]:
        """Check every answer in the executor (identical answers are checked once)."""
        return self.grade_many([(problem, answers)])[0]

    def grade_many(self, items: Sequence[tuple[CodeProblem, Sequence[str]]]) -> list[list[Grade]]:
        """Every problem's answers checked in one executor batch (identical answers of a problem once)."""
        p = self.params
        parsed = [[prompts.parse_solver_answer(self.name, a, self.style) for a in answers] for _, answers in items]
        distinct = [sorted({x for x in xs if x is not None}) for xs in parsed]
        prepared = [[self.answer_jobs(problem, x) for x in xs] for (problem, _), xs in zip(items, distinct)]
        results = iter(self._run([prep for per_problem in prepared for prep in per_problem]))
        out = []
        for (_, answers), xs, keys, preps in zip(items, parsed, distinct, prepared, strict=True):
            ran = [next(results) for _ in preps]  # every prepared answer's results, read or not
            verdict = {
                x: prep.error is None and self.answer_correct(prep, res) for x, prep, res in zip(keys, preps, ran)
            }
            grades = []
            for answer, x in zip(answers, xs, strict=True):
                ok_format = self._formatted(answer)
                correct = ok_format and x is not None and verdict[x]
                reward = p.solver_correct if correct else (p.solver_wrong if ok_format else p.solver_format)
                grades.append(Grade(reward=reward, correct=correct, formatted=ok_format))
            out.append(grades)
        return out

    def answer_jobs(self, problem: CodeProblem, answer: str) -> Prepared:
        raise NotImplementedError

    def answer_correct(self, prepared: Prepared, results: Sequence[ExecResult]) -> bool:
        return bool(results) and all(r.status == "ok" and r.value == "True" for r in results)

    # --- rewards, buffer, state -------------------------------------------------------------------------------

    def proposer_reward(self, problem: CodeProblem, solve_rate: float | None) -> float:
        """Learnability ``1 - r``; ``unsolved_reward`` at r = 0, ``solved_reward`` at r = 1; invalid or
        unformatted proposals ``invalid_reward``."""
        p = self.params
        if not problem.valid or solve_rate is None or not problem.metrics.get("formatted", True):
            return p.invalid_reward
        r = float(solve_rate)
        if not 0.0 <= r <= 1.0:
            raise ValueError(f"solve rate must lie in [0, 1], got {r}")
        if r <= 0.0:
            return p.unsolved_reward
        if r >= 1.0:
            return p.solved_reward
        return 1.0 - r

    def load_problem(self, record: Mapping[str, Any]) -> CodeProblem:
        """A :class:`CodeProblem` from a problem file's record; at least one input and an output per input."""
        return load_code_problem(record)

    def record_fields(self, problem: CodeProblem) -> dict[str, Any]:
        """``teacher_program``: whether the teacher wrote the record's program (induction's comes from the pool)."""
        return {"teacher_program": self.proposer.authors_problem}

    def problem_metrics(self, problems: Sequence[CodeProblem]) -> dict[str, Any]:
        """Of a step's valid proposals: the mean input length (of each proposal's inputs, then over proposals) and
        the distinct programs."""
        lengths = [statistics.fmean(len(x) for x in p.inputs) for p in problems if p.inputs]
        return {
            "input_chars": statistics.fmean(lengths) if lengths else None,
            "distinct_programs": len({p.program for p in problems}),
        }

    def add_to_buffer(self, problems: Sequence[CodeProblem]) -> None:
        self.buffer.add(p for p in problems if p.task_type == self.name)

    def _rng(self, rng: Any) -> Any:
        """The caller's generator, or the task's own (from the factory's ``rng``) when None."""
        return self.rng if rng is None else as_random(rng)

    def sample_problems(self, count: int, rng: Any) -> list[CodeProblem]:
        return self.buffer.recent_first(count, self._rng(rng))

    def state_dict(self) -> dict[str, Any]:
        return {"task": self.name, "buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("task") != self.name:
            raise ValueError(f"state of task {state.get('task')!r} loaded into task {self.name!r}")
        self.buffer.load_state_dict(state["buffer"])

    def _run_proposals(
        self, problems: Sequence[CodeProblem], prepared: Sequence[Prepared], completions: Sequence[str]
    ) -> list[list[ExecResult]]:
        """Run the validation jobs; program metrics are computed meanwhile in a thread (the batch mostly
        waits on the sandbox), so they stay off the hot path."""
        for prob, text in zip(problems, completions, strict=True):
            prob.metrics["formatted"] = prompts.check_format(text, self.style)
        if not self.params.compute_metrics:
            return self._run(prepared)
        from concurrent.futures import ThreadPoolExecutor

        programs = [prob.program for prob in problems]
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(lambda: [_metrics(code) for code in programs])
            results = self._run(prepared)
            measured = future.result()
        for prob, got in zip(problems, measured, strict=True):
            if got is not None:
                prob.metrics.update(got[0])
                prob.signature = got[1]
        return results


def _metrics(program: str) -> tuple[dict[str, Any], str] | None:
    """Metrics of a program that parses, else None."""
    from .metrics import program_metrics

    if not program:
        return None
    try:
        return program_metrics(program)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def reserved_names(tree: ast.AST) -> list[str]:
    """Model code may not touch the names of our in-sandbox helpers."""
    found = set()
    for node in ast.walk(tree):
        name = (
            node.id
            if isinstance(node, ast.Name)
            else node.attr
            if isinstance(node, ast.Attribute)
            else node.arg
            if isinstance(node, ast.arg)
            else node.name
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            else None
        )
        if name and name.startswith("_populora"):
            found.add(f"reserved name {name}")
        if isinstance(node, ast.Attribute) and node.attr in ("__defaults__", "__kwdefaults__"):
            found.add(f"attribute {node.attr}")
    return sorted(found)


IDENTITY = "def f(a):\n    return a"


def proposer_names(proposer: Sequence[str] | str, n: int) -> list[str]:
    if isinstance(proposer, str):
        return [proposer] * n
    names = list(proposer)
    if len(names) != n:
        raise ValueError(f"{len(names)} proposer names for {n} completions")
    return names
