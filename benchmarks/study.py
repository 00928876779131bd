"""Study: population vs the compute-matched single agent on the nano model, over several seeds.

    python -m benchmarks.study                      # seeds 0 1 2, recipes/nano.yaml vs recipes/nano_single_agent.yaml
    python -m benchmarks.study --seeds 0 --quick    # one seed, a few steps
    python -m benchmarks.study --smoke              # seed 0, 1 step, tiny probe, into a temp dir (CI)

For each seed it runs both recipes (``populora run`` in a subprocess, the same command a user types),
then reads the run directories and writes ``study.md`` and ``study.json`` under ``--out``:
probe accuracy of the population's students (mean, best, weakest) vs the base and the single agent,
the best student's gain over the base with a 95 % paired-bootstrap interval over the probe problems,
the trend of teacher program complexity (slope per step of AST depth, cyclomatic complexity, lines of
code of valid proposals), and problem-space coverage (distinct task signatures each student saw).
Whatever comes out is reported as measured. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
POPULORA = str(Path(sys.executable).parent / "populora")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x (None with fewer than two distinct x)."""
    if len({x for x, _ in points}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def paired_gain_interval(
    member: dict[str, list[int]], base: dict[str, list[int]], *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """95 % bootstrap interval of mean-over-task-types accuracy(member) - accuracy(base).

    Problems are resampled in pairs (the same problem for both, so the base's luck cancels) and within
    each task type (the probe's strata). ``member`` and ``base`` map task type -> per-problem outcomes in
    probe order. None when the outcomes are missing (probe records written before they were recorded).
    For the best of several students the interval is optimistic: it does not account for picking the best.
    """
    types = [t for t in base if t in member and len(member[t]) == len(base[t]) > 0]
    if not types or len(types) != len(base):
        return None
    diffs = {t: [m - b for m, b in zip(member[t], base[t])] for t in types}
    rng = random.Random(seed)
    gains = sorted(
        statistics.fmean(statistics.fmean(rng.choices(d, k=len(d))) for d in diffs.values()) for _ in range(resamples)
    )
    return gains[int(0.025 * resamples)], gains[int(0.975 * resamples) - 1]


def summarize(run_dir: Path) -> dict[str, Any]:
    """Probe accuracy, complexity trend and coverage of one finished run directory."""
    probe = _jsonl(run_dir / "probe.jsonl")
    final_step = max((r["step"] for r in probe), default=None)

    def accuracy(records: list[dict[str, Any]]) -> dict[str, float]:
        by_member: dict[str, list[float]] = {}
        for r in records:
            by_member.setdefault(r["member"], []).append(r["accuracy"])
        return {m: statistics.fmean(v) for m, v in by_member.items()}

    def outcomes(member: str, step: int | None) -> dict[str, list[int]]:
        return {r["task_type"]: r.get("correct", []) for r in probe if r["member"] == member and r["step"] == step}

    students = accuracy([r for r in probe if r["step"] == final_step and r["member"] != "base"])
    base = accuracy([r for r in probe if r["member"] == "base"]).get("base")
    best_member = max(students, key=lambda m: students[m], default=None)
    base_step = next((r["step"] for r in probe if r["member"] == "base"), None)
    interval = (
        paired_gain_interval(outcomes(best_member, final_step), outcomes("base", base_step))
        if best_member is not None and base_step is not None
        else None
    )
    problems = [p for p in _jsonl(run_dir / "tasks" / "problems.jsonl") if p["valid"]]
    trend = {
        key: _slope([(p["step"], p[f"metric_{key}"]) for p in problems if p.get(f"metric_{key}") is not None])
        for key in ("ast_depth", "cyclomatic", "loc")
    }
    steps = [e for e in _jsonl(run_dir / "events.jsonl") if e["event"] == "step"]
    last = steps[-1] if steps else {}
    coverage = [v for k, v in last.items() if k.endswith("/coverage")]
    return {
        "run_dir": str(run_dir),
        "steps": len(steps),
        "base_accuracy": base,
        "student_accuracy": students,
        "mean": statistics.fmean(students.values()) if students else None,
        "best": max(students.values(), default=None),
        "weakest": min(students.values(), default=None),
        "best_gain_interval": interval,
        "complexity_slope": trend,
        "coverage_mean": statistics.fmean(coverage) if coverage else None,
        "validity_mean": statistics.fmean(s["validity"] for s in steps if s.get("validity") is not None)
        if steps
        else None,
        "children": sum(1 for e in _jsonl(run_dir / "lineage.jsonl") if e["operator"] != "init"),
    }


def _fmt(value: float | None, pct: bool = True) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}" if pct else f"{value:+.3f}"


def _fmt_interval(interval: list[float] | tuple[float, float] | None) -> str:
    return "" if interval is None else f" [{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--population", default=str(REPO / "recipes" / "nano.yaml"))
    parser.add_argument("--baseline", default=str(REPO / "recipes" / "nano_single_agent.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=None, help="default: runs/study (--smoke: a temporary directory)")
    parser.add_argument("--quick", action="store_true", help="3 steps per run, a small probe")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seed 0, 1 step per run, a 3-problem probe per type, small rollouts: checks it runs, not the result",
    )
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides applied to both recipes")
    args = parser.parse_args(argv)
    if args.smoke:
        if args.out is None:
            with tempfile.TemporaryDirectory(prefix="bench-study-") as tmp:
                return study(args, Path(tmp))
        return study(args, Path(args.out))
    return study(args, Path(args.out or "runs/study"))


def study(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    seeds = [0] if args.smoke else args.seeds
    if args.smoke:
        extra = [
            "steps=1",
            "probe.problems_per_type=3",
            "rollout.proposals_per_teacher=1",
            "rollout.solver_samples=2",
            "rollout.propose_max_tokens=64",
            "rollout.solve_max_tokens=48",
        ]
    elif args.quick:
        extra = ["steps=3", "probe.problems_per_type=10"]
    else:
        extra = []
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    rows = []
    for seed in seeds:
        row: dict[str, Any] = {"seed": seed}
        for label, recipe in (("population", args.population), ("baseline", args.baseline)):
            run_dir = out / f"{label}-seed{seed}"
            if not (run_dir / "checkpoints" / "LATEST").exists():
                start = time.perf_counter()
                cmd = [
                    POPULORA,
                    "run",
                    recipe,
                    f"seed={seed}",
                    *extra,
                    *args.overrides,
                    "--run-dir",
                    str(run_dir),
                    "--no-progress",
                ]
                subprocess.run(cmd, check=True, env=env, cwd=REPO)
                print(f"{label} seed {seed}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
            row[label] = summarize(run_dir)
        rows.append(row)

    def mean_of(label: str, key: str) -> float | None:
        values = [r[label][key] for r in rows if r[label][key] is not None]
        return statistics.fmean(values) if values else None

    lines = [
        "| seed | base | pop mean | pop best | pop weakest | single agent | best - base [95 % CI] | mean - single "
        "| depth slope pop / single | coverage pop / single |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p, b = r["population"], r["baseline"]
        single = b["mean"]
        lines.append(
            f"| {r['seed']} | {_fmt(p['base_accuracy'])} | {_fmt(p['mean'])} | {_fmt(p['best'])} | "
            f"{_fmt(p['weakest'])} | {_fmt(single)} | "
            f"{_fmt(None if p['best'] is None or p['base_accuracy'] is None else p['best'] - p['base_accuracy'])}"
            f"{_fmt_interval(p['best_gain_interval'])} | "
            f"{_fmt(None if p['mean'] is None or single is None else p['mean'] - single)} | "
            f"{_fmt(p['complexity_slope']['ast_depth'], False)} / {_fmt(b['complexity_slope']['ast_depth'], False)} | "
            f"{p['coverage_mean'] or 0:.1f} / {b['coverage_mean'] or 0:.1f} |"
        )
    summary = {
        "benchmark": "study",
        "smoke": args.smoke,
        "seeds": seeds,
        "population_mean": mean_of("population", "mean"),
        "population_best": mean_of("population", "best"),
        "population_weakest": mean_of("population", "weakest"),
        "single_agent": mean_of("baseline", "mean"),
        "base": mean_of("population", "base_accuracy"),
        "coverage_population": mean_of("population", "coverage_mean"),
        "coverage_single_agent": mean_of("baseline", "coverage_mean"),
    }
    text = "# Population vs single agent on nano\n\nProbe accuracy in percent (greedy, held-out probe set).\n\n"
    text += "\n".join(lines) + "\n"
    (out / "study.md").write_text(text)
    (out / "study.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    print(text)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
