"""Study: population vs the compute-matched single agent on the nano model, over several seeds.

    python -m benchmarks.research.study                        # seeds 0 1 2, nano_study.yaml vs nano_single_agent.yaml
    python -m benchmarks.research.study --recipe long --seeds 0 1 2  # the 120-step recipes (nano_long*.yaml, 4T-4S)
    python -m benchmarks.research.study --seeds 0 --quick        # one seed, a few steps
    python -m benchmarks.research.study --smoke                  # seed 0, 1 step, tiny probe, into a temp dir (CI)
    python -m benchmarks.research.study --out runs/ablate-x KEY=VALUE ...  # an ablation: overrides applied to both arms
    python -m benchmarks.research.study --compare runs/study runs/ablate-x  # what the ablation moved, paired by seed
    python -m benchmarks.research.study --recipe arith --seeds 0 1 2 3 4     # the arithmetic world: the claims table
    python -m benchmarks.research.study --recipe arith --out runs/study-arith-no-xeval --reuse-baseline \
        runs/study-arith --population-overrides population.cross_evaluation=false     # an ablation of one arm

For each seed it runs both recipes (``populora run`` in a subprocess, the same command a user types), two
runs at a time (``--parallel``: one core each on the 2-core box); a run that was interrupted is resumed
and a finished one (its ``summary.json``) kept, so rerunning the command continues a study. Then it reads the
run directories and writes ``study.md``, ``study.json`` and the report page (``report/report.html``, both
arms side by side) under ``--out``: per seed and pooled over seeds with a 95 % t-interval, probe accuracy of
the population's students (mean, best, weakest) vs the base and the single agent, the best student's gain
over the base with a 95 % paired-bootstrap interval over the probe problems (the run summary's
``populora_report.summary.paired_gain_interval``); pooled over seeds, the same differences with the probe
problem as the unit and the seeds nested in it (``populora_core.services.statistics.cluster_bootstrap``), each with the
smallest difference its design can detect at 80 % power (``cluster_mde``), for greedy and, when the probe
samples, per-sample accuracy; and the dynamics of
``populora_report.dynamics``: the trend of teacher program complexity (slope per step of AST depth,
cyclomatic complexity, lines of code of valid proposals), solve-rate swings around the trend, and coverage
growth (new task signatures per step in the last third). Whatever comes out is reported as measured.
With a held-out evaluator (``--recipe arith``: ``arith_heldout``), each finished run is also evaluated on the
held-out set per sample (``populora eval``, k = 8) and ``study.md`` opens with the claims table of
:mod:`benchmarks.research.claims`: population mean, weakest member and best member against the single agent and
the base, overall and per level, each with its 95 % interval and detectable effect, and the run-level dynamics.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from populora_report import dynamics
from populora_report.render import render_report
from populora_report.summary import paired_gain_interval, paired_gain_mde

from populora_core.services.statistics import cluster_bootstrap, cluster_mde

from . import claims
from .transfer import cpu_name

REPO = Path(__file__).resolve().parents[2]
POPULORA = str(Path(sys.executable).parent / "populora")
RECIPES = {  # --recipe: (population, single agent)
    "short": ("nano_study.yaml", "nano_single_agent.yaml"),
    "long": ("nano_long.yaml", "nano_long_single_agent.yaml"),
    "arith": ("arith.yaml", "arith_single_agent.yaml"),
}
#: --recipe sets whose world has a held-out evaluator with levels: the claims table is measured on it
HELDOUT = {"arith": "arith_heldout"}
#: CI runs the smoke of each world (tests/benchmarks/test_benchmarks.py reads this)
CI_CASES = [["--recipe", "arith"]]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def summarize(run_dir: Path) -> dict[str, Any]:
    """Probe accuracy with the best student's paired interval, and the dynamics of one finished run directory."""
    probe = _jsonl(run_dir / "probe.jsonl")
    final_step = max((r["step"] for r in probe), default=None)

    def accuracy(records: list[dict[str, Any]]) -> dict[str, float]:
        by_member: dict[str, list[float]] = {}
        for r in records:
            by_member.setdefault(r["member"], []).append(r["accuracy"])
        return {m: statistics.fmean(v) for m, v in by_member.items()}

    def outcomes(member: str, step: int | None) -> dict[str, list[float]]:
        return {r["task_type"]: r.get("correct", []) for r in probe if r["member"] == member and r["step"] == step}

    def problems(member: str, step: int | None) -> dict[str, list[float]]:
        """Per probe problem (task types in probe order): greedy 1/0, and the share of right samples."""
        recs = [r for r in probe if r["member"] == member and r["step"] == step]
        out = {"greedy": [float(c) for r in recs for c in r.get("correct", [])]}
        if recs and all("sample_correct" in r for r in recs):
            out["sampled"] = [c / r["samples"] for r in recs for c in r["sample_correct"]]
        return out

    students = accuracy([r for r in probe if r["step"] == final_step and r["member"] != "base"])
    base = accuracy([r for r in probe if r["member"] == "base"]).get("base")
    best_member = max(students, key=lambda m: students[m], default=None)
    base_step = next((r["step"] for r in probe if r["member"] == "base"), None)
    base_records = [r for r in probe if r["member"] == "base" and r["step"] == base_step]
    interval = (
        paired_gain_interval(outcomes(best_member, final_step), outcomes("base", base_step))
        if best_member is not None and base_step is not None
        else None
    )
    mde = (
        paired_gain_mde(outcomes(best_member, final_step), outcomes("base", base_step))
        if best_member is not None and base_step is not None
        else None
    )
    steps = [e for e in _jsonl(run_dir / "events.jsonl") if e["event"] == "step"]
    return {
        "run_dir": str(run_dir),
        "steps": len(steps),
        "base_accuracy": base,
        "student_accuracy": students,
        "mean": statistics.fmean(students.values()) if students else None,
        "best": max(students.values(), default=None),
        "weakest": min(students.values(), default=None),
        "best_gain_interval": interval,
        "best_gain_mde": mde,
        # per probe problem, in probe order: what the pooled, problem-level intervals resample
        "problems": {
            "base": problems("base", base_step),
            "strata": [r["task_type"] for r in base_records for _ in r.get("correct", [])],
            **{m: problems(m, final_step) for m in sorted(students)},
        },
        "dynamics": dynamics.measure_run(steps, _jsonl(run_dir / "tasks" / "problems.jsonl"), probe),
        "validity_mean": statistics.fmean(s["validity"] for s in steps if s.get("validity") is not None)
        if steps
        else None,
        "children": sum(1 for e in _jsonl(run_dir / "lineage.jsonl") if e["operator"] != "init"),
        # how selection acted (the run summary's row): replacements that hit the youngest member, survivor changes
        "selection": json.loads((run_dir / "summary.json").read_text()).get("selection")
        if (run_dir / "summary.json").exists()
        else None,
    }


def _fmt(value: float | None, pct: bool = True) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}" if pct else f"{value:+.3f}"


def _fmt_interval(interval: list[float] | tuple[float, float] | None) -> str:
    return "" if interval is None else f" [{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default="short",
        help="short: 32 steps (nano_study.yaml, 4T-4S); long: 120 steps",
    )
    parser.add_argument("--population", default=None, help="default: the --recipe set's population recipe")
    parser.add_argument("--baseline", default=None, help="default: the --recipe set's single-agent recipe")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (each one torch thread)")
    parser.add_argument("--out", default=None, help="default: runs/study[-long] (--smoke: a temporary directory)")
    parser.add_argument("--quick", action="store_true", help="3 steps per run, a small probe")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seed 0, 1 step per run, a 3-problem probe per type, small rollouts: checks it runs, not the result",
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("REFERENCE", "OTHER"),
        help="two finished study folders (same seeds): OTHER - REFERENCE per arm and measure, paired by seed",
    )
    parser.add_argument(
        "--population-overrides",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="overrides of the population arm only (an ablation of a population mechanism)",
    )
    parser.add_argument(
        "--baseline-overrides",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="overrides of the single-agent arm only (another baseline, e.g. another compute matching)",
    )
    parser.add_argument(
        "--reuse-baseline",
        default=None,
        metavar="STUDY",
        help="take the single-agent runs of this finished study folder (same seeds) instead of running them",
    )
    parser.add_argument(
        "--reuse-population",
        default=None,
        metavar="STUDY",
        help="take the population runs of this finished study folder (same seeds) instead of running them",
    )
    parser.add_argument(
        "--heldout", default=None, help="held-out evaluator for the claims table (arith: arith_heldout)"
    )
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides applied to both recipes")
    args = parser.parse_args(argv)
    args.heldout = args.heldout or HELDOUT.get(args.recipe)
    if args.compare:
        return compare(Path(args.compare[0]), Path(args.compare[1]))
    population, baseline = RECIPES[args.recipe]
    args.population = args.population or str(REPO / "recipes" / population)
    args.baseline = args.baseline or str(REPO / "recipes" / baseline)
    if args.smoke:
        if args.out is None:
            with tempfile.TemporaryDirectory(prefix="bench-study-") as tmp:
                return study(args, Path(tmp))
        return study(args, Path(args.out))
    return study(args, Path(args.out or ("runs/study" if args.recipe == "short" else f"runs/study-{args.recipe}")))


def _reuse_arm(label: str, source: Path, out: Path, seeds: list[int]) -> None:
    """Link one arm's runs of a finished study into ``out``: an ablation of the other arm alone."""
    for seed in seeds:
        run = (source / f"{label}-seed{seed}").resolve()
        if not (run / "summary.json").exists():
            sys.exit(f"study --reuse-{label}: {run} is not a finished run")
        link = out / f"{label}-seed{seed}"
        if not link.exists():
            link.symlink_to(run, target_is_directory=True)


def _run_once(recipe: str, seed: int, run_dir: Path, extra: list[str], env: dict[str, str]) -> None:
    """``populora run`` (``resume`` for an interrupted run); its table is printed whole, runs go side by side."""
    if (run_dir / "summary.json").exists():
        return
    if (run_dir / "recipe.yaml").exists():
        cmd = [POPULORA, "resume", str(run_dir), "--no-progress"]
    else:
        cmd = [POPULORA, "run", recipe, f"seed={seed}", *extra, "--run-dir", str(run_dir), "--no-progress"]
    start = time.perf_counter()
    done = subprocess.run(cmd, check=True, env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
    print(done.stdout + f"{run_dir.name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)


FORMATS = {  # how a pooled measure is printed, by the start of its name; probe accuracies in points
    "complexity_slope/": "+.4f",
    "oscillation/swings": ".1f",
    "oscillation/amplitude": ".3f",
    "coverage/": ".2f",
    "validity": ".2f",
    "difficulty_slope": "+.4f",
    "train/": ".3f",
}


def _stat(stat: dict[str, Any], key: str = "probe/") -> str:
    """``mean [low, high]`` of a pooled value: probe accuracies (and differences) in points, else by FORMATS."""
    if stat["mean"] is None:
        return "-"
    fmt = next((f for prefix, f in FORMATS.items() if key.startswith(prefix)), ".1f")
    scale = 100 if key.startswith(("probe/", "heldout/")) else 1
    text = format(scale * stat["mean"], fmt)
    return text if stat["low"] is None else f"{text} [{scale * stat['low']:{fmt}}, {scale * stat['high']:{fmt}}]"


def _selection(row: dict[str, Any] | None) -> str:
    """The run summary's selection row in words."""
    if not row or not row.get("replacements_after_first"):
        return "no replacement after the first"
    return (
        f"{row['youngest_replaced']} of {row['replacements_after_first']} replacements after the first hit the "
        f"youngest member (chance {row['youngest_replaced_by_chance']:.1f}); the survivors changed "
        f"{row['survivor_changes']} of {row['survivor_comparisons']} times"
    )


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _mean_student(problems: dict[str, Any], kind: str) -> list[float] | None:
    """Per probe problem, the mean outcome of a run's final students."""
    lists = [v[kind] for m, v in problems.items() if m not in ("base", "strata") and kind in v]
    return [sum(col) / len(lists) for col in zip(*lists)] if lists else None


def problem_level(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pooled over seeds with the probe problem as the unit: for greedy and (when sampled) per-sample
    accuracy, best - base and population mean - single agent, each problem's cluster holding one difference
    per seed (seeds nested in problems), with a 95 % cluster-bootstrap interval and the design's minimum
    detectable effect (80 % power, two-sided 5 %). The interval is conditional on these seeds; the
    t-interval over seeds beside it counts the spread between runs."""
    out: dict[str, dict[str, Any]] = {}
    for kind in ("greedy", "sampled"):
        diffs: dict[str, list[list[float]]] = {"best_minus_base": [], "mean_minus_single": []}
        for r in rows:
            pop, single = r["population"]["problems"], r["baseline"]["problems"]
            scored = [v[kind] for m, v in pop.items() if m not in ("base", "strata") and v.get(kind)]
            best = max(scored, key=sum, default=None)  # the best student by this accuracy
            base, mean, other = pop["base"].get(kind), _mean_student(pop, kind), _mean_student(single, kind)
            if best is not None and base is not None:
                diffs["best_minus_base"].append([b - a for b, a in zip(best, base)])
            if mean is not None and other is not None:
                diffs["mean_minus_single"].append([b - a for b, a in zip(mean, other)])
        strata = rows[0]["population"]["problems"]["strata"]
        for name, per_seed in diffs.items():
            if len(per_seed) != len(rows) or not per_seed[0] or len({len(d) for d in per_seed}) > 1:
                continue
            clusters = [list(col) for col in zip(*per_seed)]  # problem -> its difference in every seed
            low, high = cluster_bootstrap(clusters, strata=strata if len(strata) == len(clusters) else None)
            out[f"{kind}/{name}"] = {
                "mean": sum(map(sum, clusters)) / sum(map(len, clusters)),
                "low": low,
                "high": high,
                "mde": cluster_mde(clusters),
                "problems": len(clusters),
            }
    return out


def _nested_table(nested: dict[str, dict[str, Any]], seeds: int) -> str:
    if not nested:
        return ""
    lines = [
        f"\n## Pooled with the probe problem as the unit (each problem's {seeds} seed(s) nested in it)\n",
        "| accuracy | difference | mean | 95 % interval (problems resampled) | detectable (80 % power) | problems |",
        "|---|---|---|---|---|---|",
    ]
    for key, v in nested.items():
        kind, name = key.split("/")
        label = "per sample" if kind == "sampled" else "greedy"
        lines.append(
            f"| {label} | {name.replace('_', ' ')} | {100 * v['mean']:+.1f} | "
            f"[{100 * v['low']:+.1f}, {100 * v['high']:+.1f}] | "
            f"{'-' if v['mde'] is None else format(100 * v['mde'], '.1f')} | {v['problems']} |"
        )
    return "\n".join(lines) + "\n"


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
    if args.parallel > 1:  # one core per run: one decoding thread, members one at a time (the same results)
        extra += ["engine.params.parallel_batches=1", "trainer.params.parallel_updates=1"]
    extra += args.overrides
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # threads: each recipe's runtime.threads (start_run applies it)
    arms = (("population", args.population), ("baseline", args.baseline))
    for label, source in (("baseline", args.reuse_baseline), ("population", args.reuse_population)):
        if source:
            _reuse_arm(label, Path(source), out, seeds)
    own = {"population": extra + args.population_overrides, "baseline": extra + args.baseline_overrides}
    jobs = [(recipe, seed, out / f"{label}-seed{seed}", own[label]) for label, recipe in arms for seed in seeds]
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:  # longest first
        for future in [
            pool.submit(_run_once, recipe, seed, run_dir, more, env) for recipe, seed, run_dir, more in jobs
        ]:
            future.result()
        if args.heldout:  # each finished run on the held-out set, per sample (populora eval), two at a time
            limit = ["--limit", "12"] if args.smoke else []
            evaluated = [
                pool.submit(claims.evaluate_heldout, POPULORA, run_dir, args.heldout, env, REPO, limit)
                for _, _, run_dir, _ in jobs
            ]
            for evaluation in evaluated:
                evaluation.result()
    rows: list[dict[str, Any]] = [
        {"seed": seed, **{label: summarize(out / f"{label}-seed{seed}") for label, _ in arms}} for seed in seeds
    ]

    def over_seeds(value: Any) -> dict[str, Any]:
        return dynamics.pooled(value(r) for r in rows)

    measures = list(rows[0]["population"]["dynamics"])
    pooled = {
        label: {
            **{
                key: over_seeds(lambda r, k=key, a=label: r[a][k])
                for key in ("base_accuracy", "mean", "best", "weakest")
            },
            **{key: over_seeds(lambda r, k=key, a=label: r[a]["dynamics"][k]) for key in measures},
        }
        for label, _ in arms
    }
    paired = {  # per seed, population minus single agent (or base): the seeds' luck cancels
        "mean_minus_single": over_seeds(lambda r: _diff(r["population"]["mean"], r["baseline"]["mean"])),
        "weakest_minus_single": over_seeds(lambda r: _diff(r["population"]["weakest"], r["baseline"]["mean"])),
        "best_minus_base": over_seeds(lambda r: _diff(r["population"]["best"], r["population"]["base_accuracy"])),
        **{
            f"{key}_minus_single": over_seeds(
                lambda r, k=key: _diff(r["population"]["dynamics"][k], r["baseline"]["dynamics"][k])
            )
            for key in measures
        },
    }
    nested = problem_level(rows)
    lines = [
        "| seed | base | pop mean | pop best | pop weakest | single agent | best - base [95 % CI] | mean - single |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p, b = r["population"], r["baseline"]
        lines.append(
            f"| {r['seed']} | {_fmt(p['base_accuracy'])} | {_fmt(p['mean'])} | {_fmt(p['best'])} | "
            f"{_fmt(p['weakest'])} | {_fmt(b['mean'])} | {_fmt(_diff(p['best'], p['base_accuracy']))}"
            f"{_fmt_interval(p['best_gain_interval'])} | {_fmt(_diff(p['mean'], b['mean']))} |"
        )
    pp, pb = pooled["population"], pooled["baseline"]
    lines.append(
        f"| pooled | {_stat(pp['base_accuracy'])} | {_stat(pp['mean'])} | {_stat(pp['best'])} | "
        f"{_stat(pp['weakest'])} | {_stat(pb['mean'])} | {_stat(paired['best_minus_base'])} | "
        f"{_stat(paired['mean_minus_single'])} |"
    )
    dyn = ["| measure | population | single agent | population - single (paired by seed) |", "|---|---|---|---|"]
    for key in measures:
        dyn.append(
            f"| {key} | {_stat(pp[key], key)} | {_stat(pb[key], key)} | {_stat(paired[f'{key}_minus_single'], key)} |"
        )
    per_seed = ["| seed | arm | " + " | ".join(measures) + " |", "|---|---|" + "---|" * len(measures)]
    for r in rows:
        for label, _ in arms:
            values = [r[label]["dynamics"][k] for k in measures]
            per_seed.append(
                f"| {r['seed']} | {label} | " + " | ".join("-" if v is None else f"{v:.4g}" for v in values) + " |"
            )
    report = render_report([run_dir for _, _, run_dir, _ in jobs], out / "report")
    summary = {
        "benchmark": "study",
        "recipe": args.recipe,
        "smoke": args.smoke,
        "seeds": seeds,
        "population_mean": pp["mean"]["mean"],
        "population_best": pp["best"]["mean"],
        "population_weakest": pp["weakest"]["mean"],
        "single_agent": pb["mean"]["mean"],
        "base": pp["base_accuracy"]["mean"],
        "mean_minus_single": paired["mean_minus_single"],
        "problem_level": nested,
        "depth_slope_population": pp["complexity_slope/ast_depth"],
        "depth_slope_single_agent": pb["complexity_slope/ast_depth"],
        "swings_population": pp["oscillation/swings"],
        "swings_single_agent": pb["oscillation/swings"],
        "new_signatures_per_step_population": pp["coverage/new_per_step"],
        "new_signatures_per_step_single_agent": pb["coverage/new_per_step"],
        "report": str(report),
    }
    claims_text, measured = "", {}
    if args.heldout:
        outcomes = [
            {label: claims.arm_outcomes(claims.read_heldout(out / f"{label}-seed{seed}" / "heldout", args.heldout))
             for label, _ in arms}
            for seed in seeds
        ]  # fmt: skip
        for row, seed_outcomes in zip(rows, outcomes, strict=True):  # what --compare pairs by seed
            for label, _ in arms:
                row[label]["heldout"] = seed_outcomes[label]["accuracy"]
        measured = {
            "heldout": claims.heldout_claims(outcomes),
            "runs": claims.run_claims(rows, lambda r, arm, key: r[arm]["dynamics"].get(key)),
        }
        claims_text = claims.table(measured["heldout"], measured["runs"], len(seeds), args.heldout) + "\n"
        summary["claims"] = {
            f"{r['claim']}/{r['level']}": {k: r[k] for k in ("mean", "low", "high", "mde")} for r in measured["heldout"]
        }
    text = f"# Population vs single agent on {_base_model(out / f'population-seed{seeds[0]}')}\n\n"
    text += (
        f"Recipes `{Path(args.population).name}` and `{Path(args.baseline).name}`, seeds {', '.join(map(str, seeds))}. "
    )
    text += f"CPU: {cpu_name()}.\n\n" + claims_text
    text += "Probe accuracy in percent (greedy, held-out probe set); pooled: mean over seeds [95 % t-interval].\n\n"
    text += "\n".join(lines) + "\n"
    text += _nested_table(nested, len(seeds))
    text += "\n## Dynamics (mean over seeds [95 % t-interval])\n\n" + "\n".join(dyn) + "\n"
    text += "\n## Dynamics per seed\n\n" + "\n".join(per_seed) + "\n"
    selection = [f"seed {r['seed']}: {_selection(r['population']['selection'])}" for r in rows]
    text += "\n## Selection (population arm)\n\n" + "\n".join(f"- {line}" for line in selection) + "\n"
    text += f"\nFigures: `{report}`\n"
    (out / "study.md").write_text(text)
    (out / "study.json").write_text(
        json.dumps(
            {
                "rows": rows,
                "pooled": pooled,
                "paired": paired,
                "problem_level": nested,
                "claims": measured,
                "summary": summary,
            },
            indent=1,
        )
    )
    print(text)
    print(json.dumps(summary))
    return summary


def _base_model(run_dir: Path) -> str:
    """The base model a run's recipe names (what the study's title says it measured)."""
    import yaml

    base = yaml.safe_load((run_dir / "recipe.yaml").read_text()).get("base_model", "?")
    return str(base.get("name", "?") if isinstance(base, dict) else base)  # the resolved recipe: {name, params}


#: what compare pairs: (label, value of one arm's row)
COMPARED: list[tuple[str, Any]] = [
    ("probe/mean", lambda arm: arm["mean"]),
    ("probe/best", lambda arm: arm["best"]),
    ("probe/weakest", lambda arm: arm["weakest"]),
    *[
        (key, lambda arm, k=key: arm["dynamics"].get(k))
        for key in (
            "complexity_slope/ast_depth",
            "complexity_slope/cyclomatic",
            "complexity_slope/loc",
            "oscillation/swings",
            "coverage/new_per_step",
            "coverage/new_per_valid_proposal",
        )
    ],
    ("validity", lambda arm: arm.get("validity_mean")),
    *[(f"heldout/{key}", lambda arm, k=key: (arm.get("heldout") or {}).get(k)) for key in ("mean", "best", "weakest")],
    *[(key, lambda arm, k=key: arm["dynamics"].get(k)) for key in ("difficulty_slope", "train/solve_rate")],
]


def compare(reference: Path, other: Path) -> dict[str, Any]:
    """OTHER - REFERENCE for each arm and measure, paired by seed (the seeds both studies ran), with a 95 %
    t-interval over seeds: what a one-mechanism ablation moved. Writes ``OTHER/compare.md``."""
    ref_rows = {r["seed"]: r for r in json.loads((reference / "study.json").read_text())["rows"]}
    rows = [r for r in json.loads((other / "study.json").read_text())["rows"] if r["seed"] in ref_rows]
    if not rows:
        sys.exit(f"study --compare: {other} and {reference} share no seed")
    seeds = [r["seed"] for r in rows]
    lines = [
        f"# {other.name} against {reference.name}",
        "",
        f"Seeds {', '.join(map(str, seeds))}; each cell: {other.name} [95 % t-interval over seeds], then its "
        f"difference from {reference.name} paired by seed. Probe accuracy in points.",
        "",
        "| measure | arm | reference | ablation | ablation - reference |",
        "|---|---|---|---|---|",
    ]
    result: dict[str, Any] = {"benchmark": "study-compare", "reference": str(reference), "other": str(other)}
    for key, value in COMPARED:
        for arm in ("population", "baseline"):
            ref = dynamics.pooled(value(ref_rows[r["seed"]][arm]) for r in rows)
            new = dynamics.pooled(value(r[arm]) for r in rows)
            diff = dynamics.pooled(_diff(value(r[arm]), value(ref_rows[r["seed"]][arm])) for r in rows)
            lines.append(f"| {key} | {arm} | {_stat(ref, key)} | {_stat(new, key)} | {_stat(diff, key)} |")
            result[f"{arm}/{key}_minus_reference"] = diff
    text = "\n".join(lines) + "\n"
    (other / "compare.md").write_text(text)
    print(text)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
