"""AZR's three code tasks: deduction (predict the output), abduction (an input), induction (the program).

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
import functools
import statistics
import tokenize
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from populora_core.api.components import ExecJob, ExecResult, Grade, Task

from . import checks, prompts
from .buffer import ProblemBuffer, as_random
from .problems import CodeProblem, load_code_problem

# --- code run inside the sandbox next to the program ------------------------------------------------------

#: Our helpers. The real builtins are captured as default arguments when the helpers are defined, so
#: neither the program's globals (``int = MyInt``) nor side effects of the answer change what they check.
FIXED_HELPERS = """
import ast as _populora_ast
import builtins as _populora_b


def _populora_plain(x, _B=_populora_b, _seqs=(_populora_b.list, _populora_b.tuple, _populora_b.set,
                                               _populora_b.frozenset),
                    _atoms=(_populora_b.int, _populora_b.float, _populora_b.complex, _populora_b.str,
                            _populora_b.bytes, _populora_b.bool, _populora_b.type(None))):
    stack, seen = [x], _B.set()
    while stack:
        y = stack.pop()
        t = _B.type(y)
        if t in _atoms:
            continue
        if _B.id(y) in seen:
            continue
        if t in _seqs:
            seen.add(_B.id(y))
            stack.extend(y)
        elif t is _B.dict:
            seen.add(_B.id(y))
            stack.extend(y.keys())
            stack.extend(y.values())
        else:
            return False
    return True


def _populora_value(thunk, _B=_populora_b, _plain=_populora_plain, _lit=_populora_ast.literal_eval):
    first = thunk()
    second = thunk()
    if _B.repr(first) != _B.repr(second):
        raise _B.RuntimeError("non-deterministic: two calls in one process returned different values")
    if not _plain(first):
        raise _B.TypeError("the output is not plain literal data (numbers, strings, bytes, None, list, "
                           "tuple, dict, set)")
    try:
        same = _lit(_B.repr(first)) == first
    except _B.Exception:
        same = False
    if not same:
        raise _B.ValueError("the output's repr does not evaluate back to the output")
    return first


def _populora_eq(gold_text, value, _plain=_populora_plain, _lit=_populora_ast.literal_eval):
    return _plain(value) and _lit(gold_text) == value
"""

#: AZR's released determinism template, reconstructed: two calls in one process compared with ``!=``.
COMPAT_HELPERS = """

def _azr_twice(thunk):
    first = thunk()
    second = thunk()
    if first != second:
        raise Exception("Non-deterministic code")
    return first
"""

COMPAT_TRUNCATE = 400


def azr_truncate(text: str, limit: int = COMPAT_TRUNCATE) -> str:
    """AZR's result normalisation: strip, then keep the first and last ``limit/2`` characters."""
    text = text.strip()
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + "..." + text[-half:]


def safe_literal(text: str) -> tuple[bool, Any]:
    """``ast.literal_eval`` that reports failure (also on absurd nesting) instead of raising."""
    try:
        return True, ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


#: deeper literals go to the sandbox: near the recursion limit its stack and ours could disagree
LITERAL_DEPTH = 50


def literal_verdict(gold: str, answer: str) -> bool | None:
    """The sandbox's deduction check, ``_populora_eq(gold, literal_eval(answer))``, computed here: parsing and
    comparing literal data runs no code. None where it could differ from the sandbox's (a deep literal, or
    recursion or memory limits hit here): the caller runs the sandbox job."""
    depth = deepest = 0
    for char in answer:
        depth += (char in "([{") - (char in ")]}")
        deepest = max(deepest, depth)
    if deepest > LITERAL_DEPTH:
        return None
    try:
        return bool(_sandbox_equality()(gold, ast.literal_eval(answer)))
    except (ValueError, TypeError, SyntaxError):  # the sandbox's literal_eval raises too: a wrong answer
        return False
    except (MemoryError, RecursionError):
        return None


@functools.cache
def _sandbox_equality() -> Callable[[str, Any], bool]:
    """``_populora_eq`` of :data:`FIXED_HELPERS`, defined here from the same text the sandbox runs: a deduction
    answer is literal data, so its check runs no program (about a third of a step's sandbox jobs, a fork each)."""
    helpers: dict[str, Any] = {}
    exec(compile(FIXED_HELPERS, "<populora helpers>", "exec"), helpers)
    return cast(Callable[[str, Any], bool], helpers["_populora_eq"])


# --- the shared machinery -----------------------------------------------------------------------------------


@dataclass
class _Prepared:
    """A proposal or answer after the static checks: jobs to run, or why it failed already."""

    error: str | None = None
    jobs: list[ExecJob] = field(default_factory=list)
    payload: Any = None


class _AZRTask(Task[CodeProblem]):
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

    def _run(self, prepared: Sequence[_Prepared]) -> list[list[ExecResult]]:
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
        bad += _reserved_names(tree)
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
        ) + _reserved_names(tree)
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

    def answer_jobs(self, problem: CodeProblem, answer: str) -> _Prepared:
        raise NotImplementedError

    def answer_correct(self, prepared: _Prepared, results: Sequence[ExecResult]) -> bool:
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
        self, problems: Sequence[CodeProblem], prepared: Sequence[_Prepared], completions: Sequence[str]
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


def _reserved_names(tree: ast.AST) -> list[str]:
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


# --- deduction and abduction ------------------------------------------------------------------------------------

IDENTITY = "def f(a):\n    return a"


class CodeIOTask(_AZRTask):
    """Deduction and abduction: a program plus one input, proposed with K references."""

    def zero_problems(self) -> list[CodeProblem]:
        """AZR's zero triplet: the identity function on ``'Hello world'``."""
        return [CodeProblem(self.name, IDENTITY, ["'Hello world'"], ["'Hello world'"], valid=True, proposer="seed")]

    def proposer_prompts(self, count: int, rng: Any) -> list[tuple[str, Any]]:
        """K references drawn uniformly without replacement from the buffer, all shown (``references_fit: all``).

        The context records what :meth:`proposer_metrics` reports: the references shown, how many were
        drawn, whether the compact budget could not hold them, and the buffer's mean program length."""
        r = self._rng(rng)
        p = self.params
        items = self.buffer.items
        buffer_chars = sum(len(x.program) for x in items) / len(items) if items else None
        compact = self.style == "compact"
        skip = compact and p.references_fit == "skip_long"
        out = []
        for _ in range(count):
            refs = self.buffer.sample(p.references, r)
            triples = [(x.program, x.inputs[0], x.outputs[0]) for x in refs]
            shown = prompts.fit_references(self.name, triples, p.proposer_max_chars) if skip else triples
            prompt = prompts.code_proposer_prompt(self.name, shown, style=self.style, banned=self.banned)
            over = compact and (len(shown) < len(triples) if skip else len(prompt) > p.proposer_max_chars)
            ctx = {
                "references": [list(t) for t in shown],
                "drawn": len(triples),
                "over_budget": over,
                "buffer_program_chars": buffer_chars,
            }
            out.append((prompt, ctx))
        return out

    def proposer_metrics(self, contexts: Sequence[Any]) -> dict[str, float | int | None]:
        """Per step, from the contexts of :meth:`proposer_prompts`: references drawn and shown per prompt, the
        mean program length of those shown beside the buffer's (equal in expectation under uniform draws),
        and the prompts whose K references the compact budget could not hold (``references/over_budget``)."""
        ctxs = [c for c in contexts if isinstance(c, dict) and "drawn" in c]
        if not ctxs:
            return {}
        shown = [len(ref[0]) for c in ctxs for ref in c["references"]]
        buffer = [c["buffer_program_chars"] for c in ctxs if c["buffer_program_chars"] is not None]
        return {
            "references/drawn": sum(c["drawn"] for c in ctxs) / len(ctxs),
            "references/shown": sum(len(c["references"]) for c in ctxs) / len(ctxs),
            "references/program_chars": sum(shown) / len(shown) if shown else None,
            "references/over_budget": sum(bool(c["over_budget"]) for c in ctxs),
            "buffer/program_chars": sum(buffer) / len(buffer) if buffer else None,
        }

    def parse_proposals(
        self, completions: Sequence[str], contexts: Sequence[Any], proposer: Sequence[str]
    ) -> list[CodeProblem]:
        problems: list[CodeProblem] = []
        prepared: list[_Prepared] = []
        for text, who in zip(completions, _names(proposer, len(completions)), strict=True):
            prob = CodeProblem(self.name, "", [], [], proposer=who)
            problems.append(prob)
            prepared.append(self._prepare(prob, text))
        results = self._run_proposals(problems, prepared, completions)
        for prob, prep, res in zip(problems, prepared, results, strict=True):
            if prep.error is None:
                err, out = self.output_from(res)
                prob.error = err
                prob.valid = err is None
                if err is None:
                    prob.outputs = [out]
            else:
                prob.error = prep.error
        return problems

    def _prepare(self, prob: CodeProblem, text: str) -> _Prepared:
        try:
            parsed = prompts.parse_code_proposal(text, self.style)
        except prompts.ParseError as exc:
            return _Prepared(error=f"parse: {exc}")
        prob.inputs = [parsed.input]
        err, program = self.check_program(parsed.program)
        prob.program = program
        if err:
            return _Prepared(error=err)
        err, call = self.check_args(parsed.input)
        if err:
            return _Prepared(error=err)
        return _Prepared(jobs=self.output_jobs(program, call))


class DeductionTask(CodeIOTask):
    """Deduction (AZR ``code_o``): the solver sees program and input and predicts the output."""

    name = "deduction"

    def solver_prompt(self, problem: CodeProblem) -> str:
        return prompts.deduction_solver_prompt(problem.program, problem.inputs[0], style=self.style)

    def answer_jobs(self, problem: CodeProblem, answer: str) -> _Prepared:
        gold = problem.outputs[0]
        if self.compat:
            # AZR's fast path ``eval(gold) == eval(agent)`` (it runs in AZR's trainer process; here in the
            # sandbox, without the program's imports), then its executor path with both pasted as code.
            fast = self._job("", f"eval({gold!r}) == eval({answer!r})")
            slow = self._job(problem.program, f"eval({gold}) == eval({answer})")
            return _Prepared(jobs=[fast, slow])
        if len(answer) > self.params.max_output_chars * 2:
            return _Prepared(error="answer too long")
        verdict = literal_verdict(gold, answer)
        if verdict is not None:
            return _Prepared(payload=verdict)
        expr = f"_populora_eq({gold!r}, _populora_ast.literal_eval({answer!r}))"
        return _Prepared(jobs=[self._job(FIXED_HELPERS, expr)])

    def answer_correct(self, prepared: _Prepared, results: Sequence[ExecResult]) -> bool:
        if self.compat:
            return any(r.status == "ok" and r.value == "True" for r in results)
        if not prepared.jobs:  # decided without the sandbox (literal_verdict)
            return bool(prepared.payload)
        return super().answer_correct(prepared, results)


class AbductionTask(CodeIOTask):
    """Abduction (AZR ``code_i``): the solver sees program and output and gives any input producing it."""

    name = "abduction"

    def solver_prompt(self, problem: CodeProblem) -> str:
        return prompts.abduction_solver_prompt(problem.program, problem.outputs[0], style=self.style)

    def answer_jobs(self, problem: CodeProblem, answer: str) -> _Prepared:
        gold = problem.outputs[0]
        if self.compat:
            return _Prepared(jobs=[self._job(problem.program, f"{gold} == f({answer})")])
        err, call = self.check_args(answer)
        if err:
            return _Prepared(error=err)
        code = problem.program + "\n" + FIXED_HELPERS
        return _Prepared(jobs=[self._job(code, f"_populora_eq({gold!r}, {call})")])


# --- induction ---------------------------------------------------------------------------------------------------

#: The zero induction entry: identity on six varied inputs (as AZR's, with our wording and real reprs).
ZERO_INDUCTION_INPUTS = [
    "'Hello world'",
    "1",
    "dict(a=1, b=2)",
    "(1.1, 1.2, 1.3)",
    "'[[1, 0, 0], [0, 0, 0], [0, 0, 0]]'",
    "1001101100010001",
]
ZERO_INDUCTION_OUTPUTS = [
    "'Hello world'",
    "1",
    "{'a': 1, 'b': 2}",
    "(1.1, 1.2, 1.3)",
    "'[[1, 0, 0], [0, 0, 0], [0, 0, 0]]'",
    "1001101100010001",
]
ZERO_INDUCTION_MESSAGE = "The function gives back exactly what it is given."


class InductionTask(_AZRTask):
    """Induction (AZR ``code_f``): the proposer writes inputs and a message for a program from the
    deduction/abduction buffers; the solver sees half of the pairs and must write a program passing
    the hidden half.

    ``tasks`` is the run's tasks by name (the factory context's mapping, read when the pool is needed):
    its deduction/abduction tasks supply the programs. Without it the task uses its own program list."""

    name = "induction"
    #: the program of an induction proposal comes from the pool, not from the teacher: the loop leaves it out of
    #: the teachers' program metrics, and problem records say so (``teacher_program: false``)
    proposer_writes_program = False

    def __init__(self, params: Any, *, executor: Any, rng: Any, tasks: Mapping[str, Any] | None = None) -> None:
        super().__init__(params, executor=executor, rng=rng)
        self._tasks = tasks
        #: Programs handed to :meth:`add_to_buffer` as deduction/abduction problems (after the run's tasks').
        self.programs = ProblemBuffer(
            [CodeProblem("deduction", IDENTITY, ["'Hello world'"], ["'Hello world'"], valid=True, proposer="seed")],
            cap=params.buffer_cap,
            eviction=self.buffer.eviction,
        )

    def zero_problems(self) -> list[CodeProblem]:
        return [
            CodeProblem(
                self.name,
                IDENTITY,
                list(ZERO_INDUCTION_INPUTS),
                list(ZERO_INDUCTION_OUTPUTS),
                message=ZERO_INDUCTION_MESSAGE,
                valid=True,
                proposer="seed",
            )
        ]

    def program_pool(self) -> list[CodeProblem]:
        """The union AZR samples from: the buffers of the run's deduction/abduction tasks in the order of
        ``tasks`` (seeds included once per buffer, as in AZR), then the programs handed to this task; only
        this task's own program list when there are no such tasks."""
        pool: list[CodeProblem] = []
        for task in (self._tasks or {}).values():
            if isinstance(task, CodeIOTask):
                pool.extend(task.buffer.items)
        if not pool:
            pool = list(self.programs.items)
        elif len(self.programs) > self.programs.seed_count:
            pool.extend(self.programs.items[self.programs.seed_count :])
        return pool

    def add_to_buffer(self, problems: Sequence[CodeProblem]) -> None:
        """Induction problems go to the induction buffer; deduction/abduction ones to the program pool."""
        self.buffer.add(p for p in problems if p.task_type == self.name)
        self.programs.add(p for p in problems if p.task_type in ("deduction", "abduction"))

    def proposer_prompts(self, count: int, rng: Any) -> list[tuple[str, Any]]:
        r = self._rng(rng)
        pool = self.program_pool()
        out = []
        for _ in range(count):
            source = pool[r.randrange(len(pool))]
            prompt = prompts.induction_proposer_prompt(source.program, n_inputs=self.params.n_inputs, style=self.style)
            out.append((prompt, {"program": source.program}))
        return out

    def parse_proposals(
        self, completions: Sequence[str], contexts: Sequence[Any], proposer: Sequence[str]
    ) -> list[CodeProblem]:
        if len(contexts) != len(completions):
            raise ValueError("induction needs one context (the program) per completion")
        problems: list[CodeProblem] = []
        prepared: list[_Prepared] = []
        for text, ctx, who in zip(completions, contexts, _names(proposer, len(completions)), strict=True):
            program = ctx["program"] if isinstance(ctx, dict) else str(ctx)
            prob = CodeProblem(self.name, program, [], [], proposer=who)
            problems.append(prob)
            prepared.append(self._prepare(prob, text))
        results = self._run_proposals(problems, prepared, completions)
        for prob, prep, res in zip(problems, prepared, results, strict=True):
            if prep.error is None:
                outputs, errors = [], []
                for k in range(len(prob.inputs)):
                    err, out = self.output_from(res[k * prep.payload : (k + 1) * prep.payload])
                    outputs.append(out)
                    if err:
                        errors.append(f"input {k + 1}: {err}")
                prob.outputs = outputs
                prob.valid = not errors
                prob.error = "; ".join(errors) or None
            else:
                prob.error = prep.error
        return problems

    def _prepare(self, prob: CodeProblem, text: str) -> _Prepared:
        try:
            inputs, message = prompts.parse_induction_proposal(text, self.params.n_inputs, self.style)
        except prompts.ParseError as exc:
            return _Prepared(error=f"parse: {exc}")
        prob.inputs, prob.message = inputs, message
        err, program = self.check_program(prob.program)
        if err:
            return _Prepared(error=f"program: {err}")
        prob.program = program
        jobs: list[ExecJob] = []
        for k, inp in enumerate(inputs):
            err, call = self.check_args(inp)
            if err:
                return _Prepared(error=f"input {k + 1}: {err}")
            jobs.extend(self.output_jobs(program, call))
        return _Prepared(jobs=jobs, payload=len(jobs) // len(inputs))

    @staticmethod
    def split(problem: CodeProblem) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """AZR's split: the first half of the pairs is shown, the second half is hidden."""
        pairs = list(zip(problem.inputs, problem.outputs, strict=True))
        half = len(pairs) // 2
        return pairs[:half], pairs[half:]

    def solver_prompt(self, problem: CodeProblem) -> str:
        shown, _ = self.split(problem)
        return prompts.induction_solver_prompt(
            shown, problem.message, style=self.style, max_chars=self.params.compact_max_chars
        )

    def answer_jobs(self, problem: CodeProblem, answer: str) -> _Prepared:
        _, hidden = self.split(problem)
        imports = checks.imports_of(ast.parse(problem.program))
        if self.compat:
            code = (imports + "\n" + answer) if imports else answer
            return _Prepared(jobs=[self._job(code, f"{out} == f({inp})") for inp, out in hidden])
        if len(answer) > self.params.max_program_chars:
            return _Prepared(error="program too long")
        try:
            tree = ast.parse(answer)
        except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
            return _Prepared(error=f"syntax: {exc}")
        bad = checks.banned_violations(
            tree, self.banned, self.params.banned_builtins, self.params.banned_attributes
        ) + _reserved_names(tree)
        if bad:
            return _Prepared(error="banned: " + "; ".join(bad))
        code = (imports + "\n" if imports else "") + answer + "\n" + FIXED_HELPERS
        jobs = []
        for inp, out in hidden:
            err, call = self.check_args(inp)
            if err:
                return _Prepared(error=err)
            jobs.append(self._job(code, f"_populora_eq({out!r}, {call})"))
        return _Prepared(jobs=jobs)


def _names(proposer: Sequence[str] | str, n: int) -> list[str]:
    if isinstance(proposer, str):
        return [proposer] * n
    names = list(proposer)
    if len(names) != n:
        raise ValueError(f"{len(names)} proposer names for {n} completions")
    return names
