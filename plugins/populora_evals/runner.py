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

from populora_core.api.components import GenerationRequest, SamplingParams
from populora_core.services.files import atomic_write_text

from .evaluators import Benchmark
from .groups import average_columns, average_members, averages
from .passk import summarize
from .target import Subject, Target

#: Bump when prompts, extraction or grading change, so old cache entries are not reused.
EVAL_VERSION = 3  # 3: EvalPlus special cases and input types, LiveCodeBench preamble, gold normalised


@dataclass
class Settings:
    limit: int | None = None  # --limit: the first N problems of every benchmark
    limits: dict[str, int] = field(default_factory=dict)  # NAME:N in --benchmarks (or the base's default set)
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
    progress: bool | None = None  # the bar: None = on a terminal

    def limit_for(self, name: str) -> int | None:
        """How many of a benchmark's first problems are used: the smaller of --limit and its NAME:N."""
        counts = [c for c in (self.limit, self.limits.get(name)) if c is not None]
        return min(counts) if counts else None


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_executor(name: str = "sandbox", params: dict[str, Any] | None = None) -> Any:
    """The code-grading executor from the registry.

    Where the executor has an import allowlist (``extra_modules``), ``signal`` is added so the test
    harness can give every test its own SIGALRM timer, which also interrupts blocking calls such as
    ``time.sleep`` (without it the harness falls back to a watchdog thread).
    """
    from populora_core.api import get_registry

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
        "limit": settings.limit_for(bench.name),
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
        self.notes: list[str] = []  # what the results say beside the scores (prompts skipped as too long)

    # --- components from the registry ------------------------------------------------------------

    def _registry_engine(self) -> Any:
        """The engine, its ``auto`` settings planned for it alone on this GPU (nothing trains during an eval)."""
        from populora_core.api import build_engine

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
        planned = []
        try:
            for bench in self.benches:
                items = bench.items(self.settings.limit_for(bench.name))
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
                planned.append((bench, items, *self._cached(bench)))
            total = sum(len(items) * sum(len(todo) for _, todo in groups.values()) for _, items, _, groups in planned)
            with _Bar(total, self.settings.progress) as bar:
                for bench, items, cached, groups in planned:
                    entries = self._bench(bench, items, cached, groups, bar)
                    for label, entry in entries.items():
                        scores[label][bench.name] = entry
                    too_long = max((e.get("too_long", 0) for e in entries.values()), default=0)
                    if too_long:
                        bench_info[bench.name]["too_long"] = too_long
                        bench_info[bench.name]["n_items"] = len(items) - too_long
        finally:
            self.close()
        results = aggregate(self.target, self.benches, scores, bench_info, self.settings, self.timings)
        results["notes"] = [*results["notes"], *self.notes]
        return results

    def _evaluator_for(self, subject: Subject, bench: Benchmark) -> Benchmark:
        """The base model may be prompted differently (AZR: ``qwen-boxed`` for non-AZR base models)."""
        if subject.group == "base":
            return self.base_benches.get(bench.name, bench)
        return bench

    def _cached(
        self, bench: Benchmark
    ) -> tuple[dict[str, dict[str, Any]], dict[int, tuple[Benchmark, list[tuple[Subject, Path]]]]]:
        """The subjects' results found in the cache, and the rest grouped by the evaluator that prompts them."""
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
        return results, groups

    def _bench(
        self,
        bench: Benchmark,
        items: list[dict[str, Any]],
        results: dict[str, dict[str, Any]],
        groups: dict[int, tuple[Benchmark, list[tuple[Subject, Path]]]],
        bar: _Bar,
    ) -> dict[str, dict[str, Any]]:
        timing = self.timings.setdefault(bench.name, {"generate_s": 0.0, "grade_s": 0.0})
        todo_count = sum(len(todo) for _, todo in groups.values())
        if todo_count:
            _log(
                f"{bench.name}: {len(items)} problems x {todo_count} model(s) "
                f"({len(self.target.subjects) - todo_count} cached)"
            )
        for ev, todo in groups.values():
            results.update(self._generate_and_grade(ev, items, todo, timing, bar))
        for subject in self.target.subjects:
            _write_samples(self.out / "samples" / _safe(subject.label) / f"{bench.name}.jsonl", results[subject.label])
        return {
            label: {**{k: v for k, v in e.items() if k != "samples"}, "outcomes": _outcomes(e)}
            for label, e in results.items()
        }

    def _budgets(self, bench: Benchmark, prompts: list[str]) -> list[int | None]:
        """Each prompt's budget of new tokens: the benchmark's, or what the model's context leaves (rounded down to
        32 so that few budgets batch together); None where the prompt alone fills the context (not generated)."""
        context = self.target.context
        if context is None:
            return [bench.max_tokens] * len(prompts)
        out: list[int | None] = []
        for length in self.target.prompt_lengths(prompts):
            room = min(bench.max_tokens, context - length)
            out.append(None if room < 1 else room if room == bench.max_tokens or room < 32 else room - room % 32)
        return out

    def _generate_and_grade(
        self,
        bench: Benchmark,
        items: list[dict[str, Any]],
        todo: list[tuple[Subject, Path]],
        timing: dict[str, float],
        bar: _Bar,
    ) -> dict[str, dict[str, Any]]:
        """Every subject in ``todo`` on every problem whose prompt fits the model's context (mixed adapters in each
        ``generate`` call, one per answer budget, in parts that move the bar), then one grading batch."""
        prompts = [bench.prompt(item) for item in items]
        budgets = self._budgets(bench, prompts)
        kept = [i for i, b in enumerate(budgets) if b is not None]
        too_long, shortened = len(items) - len(kept), sum(1 for b in budgets if b is not None and b < bench.max_tokens)
        if too_long or shortened:
            parts = [f"{too_long} of {len(items)} prompts are longer than it: skipped, not scored"] if too_long else []
            if shortened:
                parts.append(f"{shortened} get fewer than {bench.max_tokens} new tokens (what the context leaves)")
            note = f"{bench.name}: the model's context is {self.target.context} tokens; {'; '.join(parts)}"
            if note not in self.notes:
                self.notes.append(note)
                _log(f"warning: {note}")
        bar.advance(too_long * len(todo))
        by_budget: dict[int, list[int]] = {}
        for i in kept:
            by_budget.setdefault(int(budgets[i] or 0), []).append(i)
        outputs: dict[tuple[int, int], list[Any]] = {}  # (subject j, item i) -> its completions
        t = time.perf_counter()
        for budget, rows in sorted(by_budget.items()):
            sampling = SamplingParams(
                n=self.settings.n,
                temperature=self.settings.temperature,
                top_p=self.settings.top_p,
                max_tokens=budget,
                stop=bench.stop(),
                seed=self.settings.seed,
            )
            asked = [(j, i) for j in range(len(todo)) for i in rows]
            requests = [GenerationRequest(prompts[i], todo[j][0].adapter, index=k) for k, (j, i) in enumerate(asked)]
            size = max(GENERATE_PART, -(-len(requests) // BAR_STEPS))  # a GPU engine still gets large batches
            for start in range(0, len(requests), size):
                part = requests[start : start + size]
                bar.describe(f"{bench.name}: generating")
                got = self.engine().generate(part, sampling)
                if len(got) != len(part):
                    raise RuntimeError(f"engine returned {len(got)} outputs for {len(part)} requests")
                outputs.update(zip(asked[start : start + size], got))
                bar.advance(len(part))
        timing["generate_s"] += time.perf_counter() - t
        graded_items = [items[i] for i in kept]
        texts = [[c.text for c in outputs[j, i]] for j in range(len(todo)) for i in kept]
        t = time.perf_counter()
        bar.describe(f"{bench.name}: grading")
        executor = self.executor() if bench.category == "code" and texts else None
        detailed = getattr(bench, "grade_detailed", None)
        if not texts:
            correct, base_ok = [], None
        elif detailed is not None:
            base_ok, correct = detailed(graded_items * len(todo), texts, executor)
        else:
            correct = bench.grade(graded_items * len(todo), texts, executor)
            base_ok = None
        timing["grade_s"] += time.perf_counter() - t
        results = {}
        for j, (subject, path) in enumerate(todo):
            mine = slice(j * len(kept), (j + 1) * len(kept))
            entry = _entry(
                bench,
                graded_items,
                texts[mine],
                correct[mine],
                base_ok[mine] if base_ok is not None else None,
                self.settings.ks,
            )
            entry["tokens"] = sum(len(c.token_ids) for i in kept for c in outputs[j, i])
            entry["template"] = bench.template
            entry["too_long"] = too_long
            atomic_write_text(path, json.dumps(entry, indent=1, default=str))
            results[subject.label] = entry
        return results


#: Requests per ``generate`` call at least (the bar moves every few seconds on a CPU), and at most ``BAR_STEPS``
#: calls per answer budget (a large evaluation on a GPU keeps vLLM's batches large).
GENERATE_PART, BAR_STEPS = 96, 20


class _Bar:
    """``populora eval``'s progress: problems x models generated, with the time left (rich, on stderr)."""

    def __init__(self, total: int, show: bool | None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} answers"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            disable=not (console.is_terminal if show is None else show),
        )
        self.task = self.progress.add_task("evaluating", total=total)

    def __enter__(self) -> _Bar:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def advance(self, n: int) -> None:
        self.progress.advance(self.task, n)

    def describe(self, text: str) -> None:
        self.progress.update(self.task, description=text)


def _safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.@" else "_" for ch in label)


def _entry(bench: Benchmark, items, texts, correct, base_ok, ks) -> dict[str, Any]:
    summary = summarize(correct, ks)
    entry: dict[str, Any] = {
        "score": 100.0 * summary.get("pass@1", summary["accuracy"]) if items else None,  # None: no problem fitted
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


def _outcomes(entry: dict[str, Any]) -> dict[str, float]:
    """Each graded problem's outcome (its share of correct samples: 1/0 greedy), by problem id: the units of the
    intervals and of pairing a member with the base."""
    return {
        str(row["id"]): sum(row["correct"]) / len(row["correct"]) for row in entry.get("samples", []) if row["correct"]
    }


def _write_samples(path: Path, entry: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for row in entry.get("samples", []):
            fh.write(json.dumps(row) + "\n")


# --- aggregation -----------------------------------------------------------------------------------


def _row(scores: dict[str, float | None]) -> dict[str, float | None]:
    return {**scores, **averages(scores)}


def _stat(rows: list[dict[str, float | None]], columns: list[str], fn) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for c in columns:
        vals = [r[c] for r in rows if r.get(c) is not None]
        out[c] = fn(vals) if vals else None
    return out


def _mean(vals: list[float]) -> float:
    return sum(vals) / len(vals)


#: Intervals: 95 % percentile bootstrap over problems, seeded (the run summary's and the report's settings).
LEVEL, RESAMPLES, BOOTSTRAP_SEED = 0.95, 2000, 0


def problem_interval(
    groups: list[dict[str, float]], reference: list[dict[str, float]] | None = None
) -> list[float] | None:
    """The 95 % interval (in %) of the mean score of ``groups`` (one subject, or several averaged), minus that of
    ``reference`` when given (paired: the same problem for both), with problems as units: each problem's outcome is
    resampled whole, so how hard the drawn problems are cancels in a difference. None without a shared problem."""
    from populora_core.services.statistics import cluster_bootstrap

    everyone = [*groups, *(reference or [])]
    if not everyone:
        return None
    ids = sorted(set.intersection(*(set(g) for g in everyone)))
    if not ids:
        return None
    units = [[_mean([g[i] for g in groups]) - (_mean([r[i] for r in reference]) if reference else 0.0)] for i in ids]
    lo, hi = cluster_bootstrap(units, resamples=RESAMPLES, seed=BOOTSTRAP_SEED, level=LEVEL)
    return [100.0 * lo, 100.0 * hi]


def ranking_score(row: dict[str, float | None], benchmarks: list[str]) -> float:
    """What best and weakest are ranked by: the mean score over the benchmarks that ran, each counted once (AVG
    leaves out those outside AZR's averages, such as nano_heldout or GSM8K)."""
    values = [v for b in benchmarks if (v := row.get(b)) is not None]
    return _mean(values) if values else 0.0


def aggregate(
    target: Target,
    benches: list[Benchmark],
    scores: dict[str, dict[str, dict[str, Any]]],
    bench_info: dict[str, Any],
    settings: Settings,
    timings: dict[str, dict[str, float]],
) -> dict[str, Any]:
    names = [b.name for b in benches]
    columns = [*names, *average_columns()]
    subjects = []
    rows: dict[str, dict[str, float | None]] = {}
    outcomes = {s.label: {b: scores[s.label][b].pop("outcomes", {}) for b in names} for s in target.subjects}
    intervals: dict[str, dict[str, list[float] | None]] = {
        s.label: {b: problem_interval([outcomes[s.label][b]]) for b in names} for s in target.subjects
    }
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
        ran = [b for b in names if any(r.get(b) is not None for r in pop)]
        ranked = sorted(zip(pop_labels, pop), key=lambda lr: ranking_score(lr[1], ran))
        out["best_member"], out["weakest_member"] = ranked[-1][0], ranked[0][0]
        out["ranked_by"] = ran
        intervals["population mean"] = {b: problem_interval([outcomes[lbl][b] for lbl in pop_labels]) for b in names}
    baseline_labels = [s.label for s in target.subjects if s.group == "baseline"]
    base_rows = [rows[label] for label in baseline_labels]
    if base_rows:
        summary["baseline"] = _stat(base_rows, columns, _mean)
        intervals["baseline"] = {b: problem_interval([outcomes[lbl][b] for lbl in baseline_labels]) for b in names}
    reference_name = "baseline" if base_rows else "base"
    reference = summary.get("baseline") or rows.get("base")
    reference_labels = baseline_labels if base_rows else ["base"]
    deltas: dict[str, dict[str, float | None]] = {}
    delta_intervals: dict[str, dict[str, list[float] | None]] = {}

    def difference(row: dict[str, float | None], ref: dict[str, float | None]) -> dict[str, float | None]:
        return {
            c: row[c] - ref[c] if row.get(c) is not None and ref.get(c) is not None else None  # type: ignore[operator]
            for c in columns
        }

    if reference is not None:
        for name in ("population mean", "population best", "population weakest"):
            if name in summary:
                deltas[f"{name} - {reference_name}"] = difference(summary[name], reference)
        if "population mean" in summary:
            delta_intervals[f"population mean - {reference_name}"] = {
                b: problem_interval(
                    [outcomes[lbl][b] for lbl in pop_labels], [outcomes[lbl][b] for lbl in reference_labels]
                )
                for b in names
            }
    if "base" in rows:  # each member paired against the base, problem by problem
        for s in target.subjects:
            if s.group in ("population", "adapter", "baseline"):
                key = f"{s.label} - base"
                deltas[key] = difference(rows[s.label], rows["base"])
                delta_intervals[key] = {
                    b: problem_interval([outcomes[s.label][b]], [outcomes["base"][b]]) for b in names
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
                "limits": settings.limits,
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
            "intervals": intervals,
            "delta_intervals": delta_intervals,
            "interval_level": LEVEL,
            "timings": timings,
            "notes": target.notes,
        }
    )
    return out
