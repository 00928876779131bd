"""Student-side ceiling on nano: the recipe's update on an ideal curriculum instead of teachers' problems.

    python -m benchmarks.research.curriculum                            # recipes/nano.yaml, seeds 0 1, 32 steps
    python -m benchmarks.research.curriculum --seeds 0 --steps 8 --quick
    python -m benchmarks.research.curriculum --smoke                    # seed 0, 1 step, tiny probe and rollouts (CI)
    python -m benchmarks.research.curriculum trainer.params.lr=1e-3     # recipe overrides, as `populora run` takes

Why: the quickstart's probe gain mixes two things, what teachers propose and what one student update
makes of it. This benchmark removes the teachers. Each step one student of the recipe (same engine,
trainer, tasks, rollout sizes and seed) solves fresh problems drawn from nano's own training
distribution: ``rollout.proposals_per_teacher`` programs per task type from the corpus generator
(`benchmarks.research.nano.corpus`, the probe's programs excluded), ``rollout.solver_samples`` samples each, graded
and trained exactly as in the loop. The probe (the run's own probe evaluation, greedy) is read every
``--probe-every`` steps; the gain is against the same adapter at step 0, which equals the base, with a
95 % interval that resamples probe problems (each seed's own, and pooled with the seeds nested in each
problem) and the smallest gain each design can detect (80 % power, two-sided 5 %).
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from populora_report.summary import paired_gain_interval, paired_gain_mde

from populora_core.services.statistics import cluster_bootstrap, cluster_mde

REPO = Path(__file__).resolve().parents[2]


def curriculum(per_type: int, seed: int, executor: Any, exclude: set[str]) -> dict[str, list[Any]]:
    """``per_type`` valid problems per task type from the corpus generator, none of them a probe program."""
    from populora_azr.problems import CodeProblem as Problem
    from populora_nano.probe import TASK_TYPES

    import benchmarks.research.nano.corpus as corpus

    programs = corpus.generate_programs(3 * per_type, random.Random(seed), executor, exclude=exclude, chunk=300)
    records = corpus.probe_records(programs, per_type, random.Random(seed + 1))
    return {
        t: [Problem(**r, valid=True, proposer="curriculum") for r in records if r["task_type"] == t] for t in TASK_TYPES
    }


def run_seed(
    recipe_path: str, overrides: list[str], seed: int, steps: int, probe_every: int, pool_size: int, work: Path
) -> dict[str, Any]:
    from populora_azr.problems import CodeProblem

    from populora_core.api.rng import derived_rng
    from populora_core.cli.driver import load_recipe, run_probe_set, solve, start_run

    recipe, resolved = load_recipe(recipe_path, [*overrides, f"seed={seed}", f"steps={steps}"])
    run = start_run(recipe, resolved, work / f"seed{seed}")
    try:
        c = run.components
        probe_programs = {p.program for items in run_probe_set(c).values() for p in items if isinstance(p, CodeProblem)}
        pool = curriculum(pool_size, 7919 + seed, c.executor, probe_programs)
        student = run.population.students[0]
        cfg = run.recipe.rollout

        def probe(step: int) -> dict[str, float]:
            rows = [r for r in run.probe(step, include_base=False) if r["member"] == student.id]
            outcomes[step] = {r["task_type"]: r["correct"] for r in rows}
            acc = {r["task_type"]: r["accuracy"] for r in rows}
            return {**acc, "mean": statistics.fmean(acc.values())}

        outcomes: dict[int, dict[str, list[float]]] = {}
        checkpoints = {0: probe(0)}
        solve_rates: list[dict[str, float]] = []
        for step in range(1, steps + 1):
            attempts = [
                (name, student, problem)
                for name in c.tasks
                for problem in derived_rng(seed, step, f"curriculum/{name}").sample(
                    pool[name], cfg.proposals_per_teacher
                )
            ]
            answers = solve(c, attempts, step, "sample/solve", n=cfg.solver_samples).answers
            rollouts = [r for scored in answers for r in scored]
            rates: dict[str, list[float]] = {}
            for (name, _, _), scored in zip(attempts, answers):
                rates.setdefault(name, []).append(statistics.fmean(r.info["correct"] for r in scored))
            parent = c.adapter_ref(student)
            student.version += 1
            c.trainer.update(student.id, parent, rollouts, run.dir.adapter_path(student.version_name))
            solve_rates.append({k: statistics.fmean(v) for k, v in rates.items()})
            if step % probe_every == 0 or step == steps:
                checkpoints[step] = probe(step)
                gain = 100 * (checkpoints[step]["mean"] - checkpoints[0]["mean"])
                print(
                    f"  seed {seed} step {step:3d}: probe mean {100 * checkpoints[step]['mean']:.1f} "
                    f"({gain:+.1f} vs step 0)",
                    flush=True,
                )
    finally:
        run.close()
    first, last = outcomes[0], outcomes[max(outcomes)]
    return {
        "seed": seed,
        "probe": checkpoints,
        "solve_rate": solve_rates,
        "interval": paired_gain_interval(last, first),
        "mde": paired_gain_mde(last, first),
        "gains": [b - a for t in first for a, b in zip(first[t], last[t])],  # per probe problem, final - step 0
    }


def _pts(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "nano.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--probe-every", type=int, default=8)
    parser.add_argument("--pool", type=int, default=200, help="curriculum problems per task type")
    parser.add_argument("--quick", action="store_true", help="3 steps, a 10-problem probe per type")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seed 0, 1 step, a 3-problem probe per type, 2 x 2 rollouts per type: checks it runs, not the gain",
    )
    parser.add_argument("overrides", nargs="*", help="key.sub=value recipe overrides")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    steps, probe_every, seeds, pool = args.steps, args.probe_every, args.seeds, args.pool
    if args.smoke:
        steps, probe_every, seeds, pool = 1, 1, [0], 10
        overrides += [
            "probe.problems_per_type=3",
            "rollout.proposals_per_teacher=2",
            "rollout.solver_samples=2",
        ]
    elif args.quick:
        steps, probe_every = 3, 3
        overrides.append("probe.problems_per_type=10")
    start = time.time()
    results = []
    with tempfile.TemporaryDirectory(prefix="populora-curriculum-") as tmp:
        for seed in seeds:
            results.append(run_seed(args.recipe, overrides, seed, steps, probe_every, pool, Path(tmp)))
    print(f"\nprobe accuracy (%, greedy) of one student trained on the ideal curriculum; {args.recipe}")
    head = " | ".join(f"step {s}" for s in results[0]["probe"])
    print(f"| seed | {head} | final - step 0 [95 % interval, problems resampled] | detectable (80 % power) |")
    print("|---" * (len(results[0]["probe"]) + 3) + "|")
    for r in results:
        cells = " | ".join(f"{100 * p['mean']:.1f}" for p in r["probe"].values())
        final = list(r["probe"].values())[-1]["mean"] - r["probe"][0]["mean"]
        low, high = r["interval"] or (float("nan"), float("nan"))
        print(
            f"| {r['seed']} | {cells} | {100 * final:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] | {_pts(r['mde'])} |"
        )
    clusters = [list(col) for col in zip(*(r.pop("gains") for r in results))]  # problem -> its gain per seed
    mean = sum(map(sum, clusters)) / sum(map(len, clusters))
    low, high = cluster_bootstrap(clusters)
    mde = cluster_mde(clusters)
    pooled = {"mean": mean, "interval": [low, high], "mde": mde, "problems": len(clusters)}
    blank = " |" * len(results[0]["probe"])
    print(
        f"| pooled, seeds nested in problems |{blank} {100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] "
        f"| {_pts(mde)} |"
    )
    summary = {
        "benchmark": "curriculum",
        "recipe": args.recipe,
        "overrides": overrides,
        "steps": steps,
        "seconds": round(time.time() - start, 1),
        "seeds": results,
        "pooled": pooled,
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
