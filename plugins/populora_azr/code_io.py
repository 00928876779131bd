"""Deduction and abduction (AZR ``code_o`` and ``code_i``): the teacher writes a program and an input, the sandbox
computes the gold output; the solver predicts the output (deduction) or an input giving it (abduction)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from populora_core.api.components import ExecResult

from . import prompts
from .code_task import IDENTITY, AZRTask, Prepared, proposer_names
from .problems import CodeProblem
from .sandbox_code import FIXED_HELPERS, literal_verdict


class CodeIOTask(AZRTask):
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
        prepared: list[Prepared] = []
        for text, who in zip(completions, proposer_names(proposer, len(completions)), strict=True):
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

    def _prepare(self, prob: CodeProblem, text: str) -> Prepared:
        try:
            parsed = prompts.parse_code_proposal(text, self.style)
        except prompts.ParseError as exc:
            return Prepared(error=f"parse: {exc}")
        prob.inputs = [parsed.input]
        err, program = self.check_program(parsed.program)
        prob.program = program
        if err:
            return Prepared(error=err)
        err, call = self.check_args(parsed.input)
        if err:
            return Prepared(error=err)
        return Prepared(jobs=self.output_jobs(program, call))


class DeductionTask(CodeIOTask):
    """Deduction (AZR ``code_o``): the solver sees program and input and predicts the output."""

    name = "deduction"

    def solver_prompt(self, problem: CodeProblem) -> str:
        return prompts.deduction_solver_prompt(problem.program, problem.inputs[0], style=self.style)

    def answer_jobs(self, problem: CodeProblem, answer: str) -> Prepared:
        gold = problem.outputs[0]
        if self.compat:
            # AZR's fast path ``eval(gold) == eval(agent)`` (it runs in AZR's trainer process; here in the
            # sandbox, without the program's imports), then its executor path with both pasted as code.
            fast = self._job("", f"eval({gold!r}) == eval({answer!r})")
            slow = self._job(problem.program, f"eval({gold}) == eval({answer})")
            return Prepared(jobs=[fast, slow])
        if len(answer) > self.params.max_output_chars * 2:
            return Prepared(error="answer too long")
        verdict = literal_verdict(gold, answer)
        if verdict is not None:
            return Prepared(payload=verdict)
        expr = f"_populora_eq({gold!r}, _populora_ast.literal_eval({answer!r}))"
        return Prepared(jobs=[self._job(FIXED_HELPERS, expr)])

    def answer_correct(self, prepared: Prepared, results: Sequence[ExecResult]) -> bool:
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

    def answer_jobs(self, problem: CodeProblem, answer: str) -> Prepared:
        gold = problem.outputs[0]
        if self.compat:
            return Prepared(jobs=[self._job(problem.program, f"{gold} == f({answer})")])
        err, call = self.check_args(answer)
        if err:
            return Prepared(error=err)
        code = problem.program + "\n" + FIXED_HELPERS
        return Prepared(jobs=[self._job(code, f"_populora_eq({gold!r}, {call})")])
