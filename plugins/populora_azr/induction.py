"""Induction (AZR ``code_f``): the teacher writes inputs and a message for a program from the deduction/abduction
buffers; the solver sees half of the input-output pairs and writes a program passing the hidden half."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

from populora_core.api.components import ExecJob, ProposerCapabilities

from . import checks, prompts
from .buffer import ProblemBuffer
from .code_io import CodeIOTask
from .code_task import IDENTITY, AZRTask, Prepared, proposer_names, reserved_names
from .problems import CodeProblem
from .sandbox_code import FIXED_HELPERS

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


class InductionTask(AZRTask):
    """Induction (AZR ``code_f``): the proposer writes inputs and a message for a program from the
    deduction/abduction buffers; the solver sees half of the pairs and must write a program passing
    the hidden half.

    ``tasks`` is the run's tasks by name (the factory context's mapping, read when the pool is needed):
    its deduction/abduction tasks supply the programs. Without it the task uses its own program list."""

    name = "induction"
    #: the program of an induction proposal comes from the pool, not from the teacher: the loop leaves it out of
    #: the teachers' program metrics, and problem records say so (``teacher_program: false``)
    proposer = ProposerCapabilities(authors_problem=False)

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
        prepared: list[Prepared] = []
        for text, ctx, who in zip(completions, contexts, proposer_names(proposer, len(completions)), strict=True):
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

    def _prepare(self, prob: CodeProblem, text: str) -> Prepared:
        try:
            inputs, message = prompts.parse_induction_proposal(text, self.params.n_inputs, self.style)
        except prompts.ParseError as exc:
            return Prepared(error=f"parse: {exc}")
        prob.inputs, prob.message = inputs, message
        err, program = self.check_program(prob.program)
        if err:
            return Prepared(error=f"program: {err}")
        prob.program = program
        jobs: list[ExecJob] = []
        for k, inp in enumerate(inputs):
            err, call = self.check_args(inp)
            if err:
                return Prepared(error=f"input {k + 1}: {err}")
            jobs.extend(self.output_jobs(program, call))
        return Prepared(jobs=jobs, payload=len(jobs) // len(inputs))

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

    def answer_jobs(self, problem: CodeProblem, answer: str) -> Prepared:
        _, hidden = self.split(problem)
        imports = checks.imports_of(ast.parse(problem.program))
        if self.compat:
            code = (imports + "\n" + answer) if imports else answer
            return Prepared(jobs=[self._job(code, f"{out} == f({inp})") for inp, out in hidden])
        if len(answer) > self.params.max_program_chars:
            return Prepared(error="program too long")
        try:
            tree = ast.parse(answer)
        except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
            return Prepared(error=f"syntax: {exc}")
        bad = checks.banned_violations(
            tree, self.banned, self.params.banned_builtins, self.params.banned_attributes
        ) + reserved_names(tree)
        if bad:
            return Prepared(error="banned: " + "; ".join(bad))
        code = (imports + "\n" if imports else "") + answer + "\n" + FIXED_HELPERS
        jobs = []
        for inp, out in hidden:
            err, call = self.check_args(inp)
            if err:
                return Prepared(error=err)
            jobs.append(self._job(code, f"_populora_eq({out!r}, {call})"))
        return Prepared(jobs=jobs)
