"""Benchmark: `populora eval` on a tiny model, and grading throughput against the sandbox alone.

    python -m benchmarks.evals            # one member, all shipped-data benchmarks, --limit 20 (target < 5 min)
    python -m benchmarks.evals --quick    # --limit 5, shorter generations, HumanEval-only grading (< 1 min)

Part 1 (end to end): a tiny Llama (benchmarks/tiny_model.py) plus one LoRA adapter with random non-zero B,
evaluated through the ``hf`` engine and the sandbox on every benchmark whose data ships offline
(humaneval, mbpp, aime24, math500, gsm8k; AIME 2025 ships only half its problems, so it comes from the
hub or a file) with ``--no-base`` (only the member), greedy, ``--max-tokens`` capped (the tiny model
has 512 positions; AZR's 16k budgets are for real models).
Reports wall time per phase and in total, cold (no cache) and warm (all cached).

Part 2 (grading throughput): HumanEval canonical solutions (164 jobs) and MBPP reference solutions
(1,500 assert jobs) graded through the evaluators, against ``Executor.run_batch`` on the identical,
prebuilt jobs (their ratio is noisy on a shared box), and the evaluator's own Python cost measured
directly with an executor that answers instantly (program assembly, job building, decoding).
Plus math-verify throughput on MATH-500 gold answers.

Part 3 (LiveCodeBench loading): a synthetic ``code_generation_lite`` release of release_v5's shape
(five ``test*.jsonl`` files, 880 problems, private tests as base64(zlib(pickle(json))) blobs; 4.35 GB
in all by default, 20 MB with --quick, ``--lcb-gb`` to choose) is loaded by the evaluator in a fresh
process: load time, hashing time and peak RSS against the largest file (target: under 1.5x).
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def end_to_end(workdir: Path, limit: int, max_tokens: int) -> dict[str, Any]:
    from populora_evals.cli import run_eval

    from benchmarks.tiny_model import build_tiny_model, make_adapter

    base = build_tiny_model(workdir / "tiny", max_positions=2048)  # every prompt fits: none skipped as too long
    adapter = make_adapter(workdir / "member@v1", base, seed=0)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(base)
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    kwargs: dict[str, Any] = dict(
        target=str(adapter),
        benchmarks="shipped",
        engine="hf",
        limit=limit,
        max_tokens=max_tokens,
        out=str(workdir / "eval"),
        no_base=True,
        quiet=True,
    )
    t = time.perf_counter()
    cold = run_eval(**kwargs)
    cold_s = time.perf_counter() - t
    t = time.perf_counter()
    run_eval(**kwargs)
    warm_s = time.perf_counter() - t
    timings = cold["timings"]
    return {
        "limit": limit,
        "max_tokens": max_tokens,
        "benchmarks": list(cold["benchmarks"]),
        "cold_s": round(cold_s, 2),
        "warm_cached_s": round(warm_s, 2),
        "generate_s": round(sum(v["generate_s"] for v in timings.values()), 2),
        "grade_s": round(sum(v["grade_s"] for v in timings.values()), 2),
        "per_benchmark": {k: {kk: round(vv, 2) for kk, vv in v.items()} for k, v in timings.items()},
        "tokens": sum(d.get("tokens", 0) for s in cold["subjects"] for d in s["details"].values()),
        "target_s": 300,
        "meets_target": cold_s < 300,
    }


class _Instant:
    """An executor that answers at once: timing grade() with it isolates the evaluator's own cost."""

    def run_batch(self, jobs):
        from populora_core.api.components import ExecResult

        return [ExecResult("ok", "True") for _ in jobs]

    def close(self) -> None:
        pass


def grading_throughput(quick: bool) -> dict[str, Any]:
    from populora_evals import grading
    from populora_evals.evaluators import BENCHMARKS, EvaluatorParams, FunctionBenchmark
    from populora_evals.runner import make_executor

    executor = make_executor("sandbox")
    out: dict[str, Any] = {}
    try:
        executor.run_batch([grading.ExecJob("x = 1", "x", 5.0)] * 8)  # warm the zygotes
        cases = [("humaneval", "canonical_solution")] + ([] if quick else [("mbpp", "code")])
        for name, field in cases:
            b = BENCHMARKS[name](EvaluatorParams(timeout_s=60))
            items = b.items()
            comps = [[it[field]] for it in items]
            if name == "humaneval":
                assert isinstance(b, FunctionBenchmark)  # HumanEval is one
                jobs = [
                    grading.check_job(b.program(it, c[0]), it["test"], it["entry_point"], 60)
                    for it, c in zip(items, comps)
                ]
            else:
                jobs = [grading.assert_job(it["code"], it["setup"], test, 60) for it in items for test in it["tests"]]
            t = time.perf_counter()
            raw = executor.run_batch(jobs)
            sandbox_s = time.perf_counter() - t
            t = time.perf_counter()
            graded = b.grade(items, comps, executor)
            grade_s = time.perf_counter() - t
            t = time.perf_counter()
            b.grade(items, comps, _Instant())
            python_s = time.perf_counter() - t
            out[name] = {
                "problems": len(items),
                "jobs": len(jobs),
                "passed": sum(r[0] for r in graded),
                "sandbox_only_s": round(sandbox_s, 3),
                "evaluator_s": round(grade_s, 3),
                "jobs_per_s_sandbox": round(len(jobs) / sandbox_s, 1),
                "jobs_per_s_evaluator": round(len(jobs) / grade_s, 1),
                "overhead_ratio": round(grade_s / sandbox_s, 3),
                "evaluator_python_s": round(python_s, 4),
                "python_share_of_sandbox": round(python_s / sandbox_s, 4),
                "sandbox_ok": sum(r.ok for r in raw),
            }
    finally:
        executor.close()
    b = BENCHMARKS["math500"]()
    items = b.items(100 if quick else 500)
    t = time.perf_counter()
    graded = b.grade(items, [[f"</think> <answer>\\boxed{{{it['answer']}}}</answer>"] for it in items])
    math_s = time.perf_counter() - t
    out["math500_math_verify"] = {
        "answers": len(items),
        "correct": sum(r[0] for r in graded),
        "answers_per_s": round(len(items) / math_s, 1),
    }
    return out


def write_lcb_release(directory: Path, total_bytes: int, n_files: int = 5, n_problems: int = 880) -> list[Path]:
    """release_v5's shape: ``test.jsonl``, ``test2.jsonl`` ... with one valid compressed private-test blob
    of about ``total_bytes / n_problems`` bytes per problem (the same blob on every line: fast to write)."""
    import base64
    import pickle
    import random
    import zlib

    rng = random.Random(0)
    per_problem = max(1000, total_bytes // n_problems)

    def make_blob(digits: int) -> str:
        tests, size = [], 0
        while size < digits:
            value = "".join(rng.choices("0123456789 \n", k=min(1 << 16, digits - size)))
            tests.append({"input": value, "output": value[:64], "testtype": "stdin"})
            size += len(value)
        return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)), 1)).decode()

    probe = make_blob(1 << 20)  # calibrate: encoded bytes per character of test input
    blob = make_blob(max(1, int(per_problem * (1 << 20) / len(probe))))
    public = json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}])
    names = ["test.jsonl"] + [f"test{k}.jsonl" for k in range(2, n_files + 1)]
    paths = [directory / name for name in names]
    for k, path in enumerate(paths):
        with open(path, "w") as fh:
            for q in range(k, n_problems, n_files):
                head = json.dumps(
                    {
                        "question_title": f"Synthetic {q}",
                        "question_content": "Read two integers and print their sum. " * 20,
                        "platform": "atcoder",
                        "question_id": f"syn{q:04d}",
                        "contest_id": f"abc{q:03d}",
                        "contest_date": f"2024-{q % 12 + 1:02d}-01T00:00:00",
                        "starter_code": "",
                        "difficulty": "easy",
                        "public_test_cases": public,
                        "metadata": "{}",
                    }
                )
                fh.write(head[:-1] + ', "private_test_cases": "' + blob + '"}\n')
    return paths


_LOAD_LCB = """
import json, resource, sys, time
from populora_evals.evaluators import BENCHMARKS, EvaluatorParams
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
b = BENCHMARKS["livecodebench"](EvaluatorParams(path=sys.argv[1]))
t = time.perf_counter()
items = b.items()
load_s = time.perf_counter() - t
t = time.perf_counter()
b.data_files()
hash_s = time.perf_counter() - t
print(json.dumps({"problems": len(items), "load_s": load_s, "hash_s": hash_s, "skipped": len(b.skipped()),
                  "rss_before_load_kb": before, "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def lcb_loading(workdir: Path, total_gb: float) -> dict[str, Any]:
    """Load a synthetic LiveCodeBench release in a fresh process; its peak RSS against the largest file."""
    import subprocess

    directory = workdir / "lcb_release"
    directory.mkdir()
    t = time.perf_counter()
    paths = write_lcb_release(directory, int(total_gb * 1e9))
    write_s = time.perf_counter() - t
    sizes = [p.stat().st_size for p in paths]
    done = subprocess.run([sys.executable, "-c", _LOAD_LCB, str(directory)], capture_output=True, text=True, check=True)
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    peak = measured["peak_rss_kb"] * 1024
    growth = (measured["peak_rss_kb"] - measured["rss_before_load_kb"]) * 1024
    largest = max(sizes)
    for p in paths:
        p.unlink()
    return {
        "files": len(paths),
        "total_bytes": sum(sizes),
        "largest_file_bytes": largest,
        "write_s": round(write_s, 2),
        "problems": measured["problems"],
        "load_s": round(measured["load_s"], 2),
        "hash_s": round(measured["hash_s"], 2),
        "peak_rss_bytes": peak,
        "rss_growth_while_loading_bytes": growth,
        "peak_over_largest_file": round(peak / largest, 3),
        "target_peak_over_largest_file": 1.5,
        # at --quick sizes the interpreter itself (~35 MB) outweighs the files: no verdict there
        "meets_target": peak < 1.5 * largest if largest >= 100e6 else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--lcb-gb", type=float, default=None, help="synthetic LiveCodeBench size (4.35; quick 0.02)")
    parser.add_argument("--lcb-only", action="store_true", help="only part 3 (LiveCodeBench loading)")
    args = parser.parse_args()
    os.environ.setdefault("POPULORA_LOAD_PLUGINS", "evals,engines,sandbox")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    limit, max_tokens = (5, 32) if args.quick else (20, 128)
    lcb_gb = args.lcb_gb if args.lcb_gb is not None else (0.02 if args.quick else 4.35)
    e2e: dict[str, Any] = {}
    throughput: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="populora-bench-evals-") as tmp:
        if not args.lcb_only:
            e2e = end_to_end(Path(tmp), limit, max_tokens)
            print(f"end to end: {json.dumps(e2e)}", file=sys.stderr)
            throughput = grading_throughput(args.quick)
            print(f"grading: {json.dumps(throughput)}", file=sys.stderr)
        lcb = lcb_loading(Path(tmp), lcb_gb)
        print(f"livecodebench loading: {json.dumps(lcb)}", file=sys.stderr)
    print(
        json.dumps(
            {
                "benchmark": "evals",
                "quick": args.quick,
                "cpus": os.cpu_count(),
                "omp_threads": os.environ.get("OMP_NUM_THREADS"),
                "python": platform.python_version(),
                "end_to_end": e2e,
                "grading": throughput,
                "livecodebench_loading": lcb,
            }
        )
    )


if __name__ == "__main__":
    main()
