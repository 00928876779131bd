"""``populora eval --check-gold``: every benchmark's own gold answers through the real grader.

Code benchmarks: each task's canonical program (HumanEval / HumanEval+ / MBPP+ ``canonical_solution``,
MBPP ``code``) written as the ``evalplus`` template's completion, graded in the sandbox exactly as a
model's would be. Math benchmarks: the gold answer written as a model would (``</think> <answer>\\boxed{gold}
</answer>`` for the AZR templates, ``\\boxed{gold}`` for ``qwen-boxed``), graded by math-verify.
LiveCodeBench ships no reference programs: its check is that every problem's tests (private ones
decompressed) can be read.

Where the gold of a benchmark is known to fail for a reason of the data, :data:`KNOWN_EXCEPTIONS`
names it; such a failure is listed with its reason and does not fail the check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import grading
from .data import livecodebench, records

#: (benchmark, problem id) -> why its own gold does not grade right; printed, not counted as a failure.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {
    # measured on EvalPlus's MbppPlus.jsonl v0.2.0 (378 tasks): the other 377 canonical solutions pass
    ("mbpp_plus", "Mbpp/255"): (
        "combinations_colors' reference output for its largest plus inputs outgrows the sandbox's 1 GiB "
        "address space (EvalPlus allows 4 GiB: --executor-param memory_mb=4096)"
    ),
}


@dataclass
class GoldReport:
    """One benchmark's self-check: problems loaded and skipped, gold graded right, each failure's reason."""

    benchmark: str
    loaded: int
    skipped: list[str]
    right: int
    checked: int
    failures: dict[str, str] = field(default_factory=dict)
    excepted: dict[str, str] = field(default_factory=dict)
    what: str = "gold graded right"

    @property
    def ok(self) -> bool:
        return not self.failures

    def line(self) -> str:
        pct = 100.0 * self.right / self.checked if self.checked else 0.0
        return (
            f"{self.benchmark}: {self.loaded} loaded, {len(self.skipped)} skipped, "
            f"{self.what} {self.right}/{self.checked} ({pct:.1f}%)"
        )


def gold_completion(bench: Any, item: dict[str, Any]) -> str:
    """The benchmark's gold answer for ``item`` written as a completion in the evaluator's template."""
    if bench.category == "math":
        if bench.template == "qwen-boxed":
            return f"The answer is $\\boxed{{{item['answer']}}}$."
        return f" I worked it out. </think> <answer>\\boxed{{{item['answer']}}}</answer>"
    code = item["code"] if bench.name == "mbpp" else item["canonical_solution"]
    if bench.template == "azr":
        return f"</think> <answer>\n```python\n{code}\n```</answer>"
    return f"{code}\n```\n"


def _explain_evalplus(bench: Any, items: Sequence[dict[str, Any]], executor: Any) -> dict[str, str]:
    """Why each EvalPlus canonical solution fails: the harness's first failure on its inputs."""
    jobs = []
    for item in items:
        program = bench.program(item, gold_completion(bench, item))
        gold = grading.assemble(item["prompt"], item["canonical_solution"], item["entry_point"])
        inputs = list(item["base_input"]) + list(item["plus_input"])
        jobs.append(
            grading.evalplus_job(
                program,
                gold,
                item["entry_point"],
                inputs,
                item["atol"],
                bench.params.timeout_s,
                mbpp=str(item["id"]).startswith("Mbpp/"),
            )
        )
    reasons = {}
    for item, result in zip(items, grading.run_jobs(executor, jobs)):
        total = len(item["base_input"]) + len(item["plus_input"])
        outcome = grading.chunk_outcome(result, total)
        reasons[item["id"]] = f"input {outcome.passed + 1} of {total}: {outcome.message}"
    return reasons


def check_benchmark(bench: Any, executor: Any = None, limit: int | None = None) -> GoldReport:
    items = bench.items(limit)
    skipped = bench.skipped()
    loaded = len(bench.items())
    if bench.name == "livecodebench":
        failures = {}
        for item in items:
            try:
                livecodebench.lcb_tests(item)
            except records.RECORD_ERRORS as exc:
                failures[item["id"]] = f"tests unreadable: {type(exc).__name__}: {exc}"
        return GoldReport(
            bench.name,
            loaded,
            skipped,
            len(items) - len(failures),
            len(items),
            failures,
            what="tests readable (no reference programs in the dataset)",
        )
    completions = [[gold_completion(bench, item)] for item in items]
    verdicts = bench.grade(items, completions, executor)
    wrong = [item for item, v in zip(items, verdicts) if not v[0]]
    reasons: dict[str, str] = {}
    if wrong and hasattr(bench, "grade_detailed"):
        reasons = _explain_evalplus(bench, wrong, executor)
    failures, excepted = {}, {}
    for item in wrong:
        why = reasons.get(item["id"]) or (
            f"gold {item['answer']!r} does not verify against itself" if bench.category == "math" else "fails its tests"
        )
        known = KNOWN_EXCEPTIONS.get((bench.name, str(item["id"])))
        if known:
            excepted[item["id"]] = f"{known} ({why})"
        else:
            failures[item["id"]] = why
    return GoldReport(bench.name, loaded, skipped, len(items) - len(wrong), len(items), failures, excepted)


def check_gold(benches: Sequence[Any], executor_factory: Any, limit: int | None = None) -> list[GoldReport]:
    """Self-check every benchmark; the executor is made only if a code benchmark needs it."""
    executor = None
    reports = []
    try:
        for bench in benches:
            if bench.category == "code" and bench.name != "livecodebench" and executor is None:
                executor = executor_factory()
            reports.append(check_benchmark(bench, executor, limit))
    finally:
        if executor is not None and hasattr(executor, "close"):
            executor.close()
    return reports
