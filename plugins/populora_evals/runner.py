"""Evaluate subjects (base, members, baseline) on benchmarks: cache, generate, grade, aggregate.

One engine serves every subject (mixed adapters in one ``generate`` call per benchmark); one
executor grades all code. Results are cached per (subject identity = version + adapter hash,
base model, benchmark, settings, dataset hash), so a rerun only generates what is new.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from populora_core.components import GenerationRequest, SamplingParams
from populora_core.files import atomic_write_text

from .evaluators import AZR_CODE, AZR_MATH, CODE_STAND_INS, Benchmark
from .passk import summarize
from .target import Subject, Target

#: Bump when prompts, extraction or grading change, so old cache entries are not reused.
EVAL_VERSION = 3  # 3: EvalPlus special cases and input types, LiveCodeBench preamble, gold normalised


@dataclass
class Settings:
    limit: int | None = None
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    ks: tuple[int, ...] = (1,)
    engine: str = "hf"
    engine_params: dict[str, Any] = field(default_factory=dict)
    engine_origin: str = "default"  # "run recipe" | "--engine" | "default"
    executor: str = "sandbox"
    executor_params: dict[str, Any] = field(default_factory=dict)
    use_cache: bool = True


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_executor(name: str = "sandbox", params: dict[str, Any] | None = None) -> Any:
    """The code-grading executor from the registry.

    Where the executor has an import allowlist (``extra_modules``), ``signal`` is added so the test
    harness can give every test its own SIGALRM timer, which also interrupts blocking calls such as
    ``time.sleep`` (without it the harness falls back to a watchdog thread).
    """
    from populora_core import get_registry

    comp = get_registry().get("executor", name)
    raw = dict(params or {})
    if "extra_modules" in comp.params_model.model_fields:
        extra = raw.get("extra_modules") or []
        raw["extra_modules"] = [*([extra] if isinstance(extra, str) else extra), "signal"]
    return comp.build(raw)


def cache_key(subject: Subject, target: Target, bench: Benchmark, settings: Settings) -> str:
    spec = {
        "v": EVAL_VERSION,
        "subject": subject.identity(),
        "base": target.base_fingerprint,
        "benchmark": bench.name,
        "dataset": bench.dataset_hash(),
        "template": bench.template,
        "max_tokens": bench.max_tokens,
        "params": bench.params.model_dump(exclude={"path", "source", "revision"}),  # the data: "dataset"
        "limit": settings.limit,
        "n": settings.n,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "seed": settings.seed,
        "engine": settings.engine,
        "dtype": target.base_model.dtype,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]


class Evaluation:
    """Runs the evaluation of a target; engine and executor are created only if something is new."""

    def __init__(
        self,
        target: Target,
        benches: list[Benchmark],
        settings: Settings,
        out_dir: Path,
        make_engine: Callable[[], Any] | None = None,
        make_executor: Callable[[], Any] | None = None,
        base_benches: dict[str, Benchmark] | None = None,
    ) -> None:
        self.target, self.benches, self.settings, self.out = target, benches, settings, out_dir
        self.base_benches = base_benches or {}
        self._make_engine = make_engine or self._registry_engine
        self._make_executor = make_executor or self._registry_executor
        self._engine: Any = None
        self._executor: Any = None
        self.timings: dict[str, dict[str, float]] = {}

    # --- components from the registry ------------------------------------------------------------

    def _registry_engine(self) -> Any:
        """The engine, its ``auto`` settings planned for it alone on this GPU (nothing trains during an eval)."""
        from populora_core import build_engine

        return build_engine(
            self.settings.engine,
            self.settings.engine_params,
            who="populora eval",
            base_model=self.target.base_model,
            lora=self.target.lora_settings(),
            seed=self.settings.seed,
            log=_log,
        )

    def _registry_executor(self) -> Any:
        return make_executor(self.settings.executor, self.settings.executor_params)

    def engine(self) -> Any:
        if self._engine is None:
            t = time.perf_counter()
            self._engine = self._make_engine()
            _log(f"engine {self.settings.engine} ready in {time.perf_counter() - t:.1f}s")
        return self._engine

    def executor(self) -> Any:
        if self._executor is None:
            self._executor = self._make_executor()
        return self._executor

    def close(self) -> None:
        for obj in (self._engine, self._executor):
            if obj is not None and hasattr(obj, "close"):
                obj.close()
        self._engine = self._executor = None

    # --- the work --------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        scores: dict[str, dict[str, dict[str, Any]]] = {s.label: {} for s in self.target.subjects}
        bench_info: dict[str, Any] = {}
        try:
            for bench in self.benches:
                items = bench.items(self.settings.limit)
                bench_info[bench.name] = {
                    **bench.describe(),
                    "n_items": len(items),
                    "dataset": bench.dataset(),
                    "data_files": bench.data_files(),
                    "dataset_sha256": bench.dataset_hash(),
                    "skipped": len(bench.skipped()),  # records that could not be read, each named below
                    "skipped_records": bench.skipped(),
                }
                if bench.name in self.base_benches:
                    bench_info[bench.name]["base_model_template"] = self.base_benches[bench.name].template
                for label, entry in self._bench(bench, items).items():
                    scores[label][bench.name] = entry
        finally:
            self.close()
        return aggregate(self.target, self.benches, scores, bench_info, self.settings, self.timings)

    def _evaluator_for(self, subject: Subject, bench: Benchmark) -> Benchmark:
        """The base model may be prompted differently (AZR: ``qwen-boxed`` for non-AZR base models)."""
        if subject.group == "base":
            return self.base_benches.get(bench.name, bench)
        return bench

    def _bench(self, bench: Benchmark, items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        cache_dir = self.out / "cache"
        results: dict[str, dict[str, Any]] = {}
        groups: dict[int, tuple[Benchmark, list[tuple[Subject, Path]]]] = {}
        for subject in self.target.subjects:
            ev = self._evaluator_for(subject, bench)
            path = cache_dir / f"{cache_key(subject, self.target, ev, self.settings)}.json"
            if self.settings.use_cache and path.is_file():
                results[subject.label] = json.loads(path.read_text())
            else:
                groups.setdefault(id(ev), (ev, []))[1].append((subject, path))
        timing = self.timings.setdefault(bench.name, {"generate_s": 0.0, "grade_s": 0.0})
        todo_count = sum(len(todo) for _, todo in groups.values())
        if todo_count:
            _log(
                f"{bench.name}: {len(items)} problems x {todo_count} model(s) "
                f"({len(self.target.subjects) - todo_count} cached)"
            )
        for ev, todo in groups.values():
            results.update(self._generate_and_grade(ev, items, todo, timing))
        for subject in self.target.subjects:
            _write_samples(self.out / "samples" / _safe(subject.label) / f"{bench.name}.jsonl", results[subject.label])
        return {label: {k: v for k, v in e.items() if k != "samples"} for label, e in results.items()}

    def _generate_and_grade(
        self, bench: Benchmark, items: list[dict[str, Any]], todo: list[tuple[Subject, Path]], timing: dict[str, float]
    ) -> dict[str, dict[str, Any]]:
        """One generate call for every subject in ``todo`` (mixed adapters), then one grading batch."""
        sampling = SamplingParams(
            n=self.settings.n,
            temperature=self.settings.temperature,
            top_p=self.settings.top_p,
            max_tokens=bench.max_tokens,
            stop=bench.stop(),
            seed=self.settings.seed,
        )
        prompts = [bench.prompt(item) for item in items]
        requests = [GenerationRequest(prompt=p, adapter=s.adapter) for s, _ in todo for p in prompts]
        t = time.perf_counter()
        outputs = self.engine().generate(requests, sampling) if requests else []
        timing["generate_s"] += time.perf_counter() - t
        if len(outputs) != len(requests):
            raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(requests)} requests")
        texts = [[c.text for c in out] for out in outputs]
        t = time.perf_counter()
        executor = self.executor() if bench.category == "code" else None
        detailed = getattr(bench, "grade_detailed", None)
        if detailed is not None:
            base_ok, correct = detailed(items * len(todo), texts, executor)
        else:
            correct = bench.grade(items * len(todo), texts, executor)
            base_ok = None
        timing["grade_s"] += time.perf_counter() - t
        results = {}
        for j, (subject, path) in enumerate(todo):
            rows = slice(j * len(items), (j + 1) * len(items))
            entry = _entry(
                bench,
                items,
                texts[rows],
                correct[rows],
                base_ok[rows] if base_ok is not None else None,
                self.settings.ks,
            )
            entry["tokens"] = sum(len(c.token_ids) for out in outputs[rows] for c in out)
            entry["template"] = bench.template
            atomic_write_text(path, json.dumps(entry, indent=1, default=str))
            results[subject.label] = entry
        return results


def _safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.@" else "_" for ch in label)


def _entry(bench: Benchmark, items, texts, correct, base_ok, ks) -> dict[str, Any]:
    summary = summarize(correct, ks)
    entry: dict[str, Any] = {
        "score": 100.0 * summary.get("pass@1", summary["accuracy"]),
        "n_items": len(items),
        **summary,
    }
    if base_ok is not None:
        entry["base_tests_score"] = 100.0 * summarize(base_ok, (1,))["pass@1"]
    entry["samples"] = [
        {"id": item["id"], "completions": comps, "correct": ok, "extracted": [bench.extract(c) for c in comps]}
        for item, comps, ok in zip(items, texts, correct)
    ]
    return entry


def _write_samples(path: Path, entry: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for row in entry.get("samples", []):
            fh.write(json.dumps(row) + "\n")


# --- aggregation -----------------------------------------------------------------------------------


def averages(bench_scores: dict[str, float]) -> dict[str, float | None]:
    """AZR's CAvg (3 code benchmarks), MAvg (6 math; GSM8K excluded), AVG = (CAvg + MAvg) / 2.

    Over the benchmarks evaluated; HumanEval/MBPP stand in for their plus versions when only the
    base version was run. AVG is whichever of the two exists when only one does.
    """
    code = []
    for name in AZR_CODE:
        if name in bench_scores:
            code.append(bench_scores[name])
        elif CODE_STAND_INS.get(name) in bench_scores:
            code.append(bench_scores[CODE_STAND_INS[name]])
    math = [bench_scores[n] for n in AZR_MATH if n in bench_scores]
    cavg = sum(code) / len(code) if code else None
    mavg = sum(math) / len(math) if math else None
    both = [v for v in (cavg, mavg) if v is not None]
    return {"code_avg": cavg, "math_avg": mavg, "overall": sum(both) / len(both) if both else None}


def average_members(benches: list[str]) -> dict[str, list[str]]:
    code = [
        n if n in benches else CODE_STAND_INS[n] for n in AZR_CODE if n in benches or CODE_STAND_INS.get(n) in benches
    ]
    return {"code_avg": code, "math_avg": [n for n in AZR_MATH if n in benches]}


COLUMNS_AVG = ("code_avg", "math_avg", "overall")


def _row(scores: dict[str, float]) -> dict[str, float | None]:
    return {**scores, **averages(scores)}


def _stat(rows: list[dict[str, float | None]], columns: list[str], fn) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for c in columns:
        vals = [r[c] for r in rows if r.get(c) is not None]
        out[c] = fn(vals) if vals else None
    return out


def _mean(vals: list[float]) -> float:
    return sum(vals) / len(vals)


def aggregate(
    target: Target,
    benches: list[Benchmark],
    scores: dict[str, dict[str, dict[str, Any]]],
    bench_info: dict[str, Any],
    settings: Settings,
    timings: dict[str, dict[str, float]],
) -> dict[str, Any]:
    names = [b.name for b in benches]
    columns = [*names, *COLUMNS_AVG]
    subjects = []
    rows: dict[str, dict[str, float | None]] = {}
    for s in target.subjects:
        row = _row({b: scores[s.label][b]["score"] for b in names})
        rows[s.label] = row
        subjects.append(
            {
                "label": s.label,
                "group": s.group,
                "member": s.member or None,
                "adapter_path": s.adapter.path if s.adapter else None,
                "adapter_hash": s.adapter_hash,
                "row": row,
                "details": scores[s.label],
            }
        )
    summary: dict[str, dict[str, float | None]] = {}
    pop = [rows[s.label] for s in target.subjects if s.group in ("population", "adapter")]
    pop_labels = [s.label for s in target.subjects if s.group in ("population", "adapter")]
    out: dict[str, Any] = {}
    if pop:
        summary["population mean"] = _stat(pop, columns, _mean)
        summary["population best"] = _stat(pop, columns, max)
        summary["population weakest"] = _stat(pop, columns, min)
        ranked = sorted(zip(pop_labels, pop), key=lambda lr: lr[1]["overall"] or 0.0)
        out["best_member"], out["weakest_member"] = ranked[-1][0], ranked[0][0]
    base_rows = [rows[s.label] for s in target.subjects if s.group == "baseline"]
    if base_rows:
        summary["baseline"] = _stat(base_rows, columns, _mean)
    reference_name = "baseline" if base_rows else "base"
    reference = summary.get("baseline") or rows.get("base")
    deltas: dict[str, dict[str, float | None]] = {}
    if reference is not None:
        for name in ("population mean", "population best", "population weakest"):
            if name in summary:
                deltas[f"{name} - {reference_name}"] = {
                    c: (
                        summary[name][c] - reference[c]  # type: ignore[operator]
                        if summary[name].get(c) is not None and reference.get(c) is not None
                        else None
                    )
                    for c in columns
                }
    out.update(
        {
            "target": {
                "kind": target.kind,
                "run_dir": str(target.run_dir) if target.run_dir else None,
                "base_model": target.base_model.path,
                "base_fingerprint": target.base_fingerprint,
                "dtype": target.base_model.dtype,
            },
            "settings": {
                "limit": settings.limit,
                "n": settings.n,
                "temperature": settings.temperature,
                "top_p": settings.top_p,
                "seed": settings.seed,
                "ks": list(settings.ks),
                "engine": settings.engine,
                "engine_params": settings.engine_params,
                "engine_origin": settings.engine_origin,
                "executor": settings.executor,
                "eval_version": EVAL_VERSION,
            },
            "benchmarks": bench_info,
            "columns": columns,
            "averages_of": average_members(names),
            "subjects": subjects,
            "summary": summary,
            "deltas": deltas,
            "delta_reference": reference_name,
            "timings": timings,
            "notes": target.notes,
        }
    )
    return out
