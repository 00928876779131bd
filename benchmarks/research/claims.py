"""The paper's claims, each measured, for a study whose world has a held-out evaluator with levels (the arithmetic
world's ``arith_heldout``): what :mod:`benchmarks.research.study` prints as its claims table.

Held-out accuracy is measured by the command a user types, ``populora eval RUN --benchmarks BENCH --n 8
--temperature 1.0`` (per sample: the share of a problem's k answers that are right), into ``RUN/heldout/``; a run
already evaluated is read again. Differences are paired per problem and seed; a problem's cluster holds its
difference in every seed (seeds nested in problems), resampled whole by the cluster bootstrap, within its level
when all levels pool (:func:`populora_core.services.statistics.cluster_bootstrap`), with the design's minimum detectable
effect at 80 % power (:func:`~populora_core.services.statistics.cluster_mde`). The run-level dynamics (difficulty slope,
swings against their shuffled-steps null, coverage growth, training-time solve rate and reward) are one number per
run: pooled over seeds with a 95 % t-interval, their detectable effect ``(t + z_0.8) sd / sqrt(seeds)``.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from populora_report import dynamics

from populora_core.services.statistics import cluster_bootstrap, cluster_mde

#: Samples per held-out problem and their temperature (the students' own sampling).
K = 8
TEMPERATURE = 1.0


def evaluate_heldout(
    populora: str, run_dir: Path, benchmark: str, env: dict[str, str], cwd: Path, more: Sequence[str] = ()
) -> Path:
    """``populora eval`` of a finished run's students (and its base) on ``benchmark``, k = 8 per sample; returns
    the output folder. Kept when its results exist (a rerun of the study evaluates nothing twice)."""
    out = run_dir / "heldout"
    if not (out / "results.json").exists():
        cmd = [populora, "eval", str(run_dir), "--benchmarks", benchmark, "--n", str(K), "--temperature",
               str(TEMPERATURE), "--out", str(out), *more]  # fmt: skip
        done = subprocess.run(cmd, check=True, env=env, cwd=cwd, stdout=subprocess.PIPE, text=True)
        print(done.stdout, file=sys.stderr, flush=True)
    return out


def read_heldout(out: Path, benchmark: str) -> dict[str, dict[str, float]]:
    """Per model label (``base``, member versions), per problem id, the share of its samples that were right."""
    models: dict[str, dict[str, float]] = {}
    for folder in sorted((out / "samples").iterdir()):
        path = folder / f"{benchmark}.jsonl"
        if path.exists():
            rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            models[folder.name] = {r["id"]: sum(map(bool, r["correct"])) / len(r["correct"]) for r in rows}
    return models


def level_of(problem_id: str) -> str:
    """The level of an ``arith_heldout`` item id (``L3/17`` -> ``L3``): the stratum of the bootstrap."""
    return problem_id.split("/")[0]


def arm_outcomes(models: dict[str, dict[str, float]]) -> dict[str, Any]:
    """One arm's run: the base's per-problem accuracy, each member's, and their mean, best and weakest (by the
    member's overall held-out accuracy in this run)."""
    members = {m: v for m, v in models.items() if m != "base"}
    ids = sorted(next(iter(models.values())))
    overall = {m: statistics.fmean(v[i] for i in ids) for m, v in members.items()}
    best, weakest = max(overall, key=lambda m: overall[m]), min(overall, key=lambda m: overall[m])
    return {
        "ids": ids,
        "base": [models["base"][i] for i in ids] if "base" in models else None,
        "mean": [statistics.fmean(members[m][i] for m in members) for i in ids],
        "best": [members[best][i] for i in ids],
        "weakest": [members[weakest][i] for i in ids],
        "accuracy": {"mean": statistics.fmean(overall.values()), "best": overall[best], "weakest": overall[weakest],
                     "base": statistics.fmean(models["base"].values()) if "base" in models else None},
    }  # fmt: skip


#: Held-out claims: (name, population outcome, reference outcome, which arm the reference comes from)
HELDOUT_CLAIMS: list[tuple[str, str, str, str]] = [
    ("population mean - single agent", "mean", "mean", "baseline"),
    ("weakest member - single agent", "weakest", "mean", "baseline"),
    ("best member - base", "best", "base", "population"),
    ("single agent - base", "mean", "base", "baseline"),
]


def heldout_claims(seeds: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each held-out claim overall and per level: mean difference (points of per-sample accuracy), 95 % cluster
    bootstrap interval, minimum detectable effect, problems. ``seeds``: per seed ``{"population": arm_outcomes,
    "baseline": arm_outcomes}``; the single agent's "mean" is its one adapter (several slots: their mean)."""
    ids = seeds[0]["population"]["ids"]
    levels = [level_of(i) for i in ids]
    rows = []
    for name, mine, ref, ref_arm in HELDOUT_CLAIMS:
        if name.startswith("single agent"):
            per_seed = [[a - b for a, b in zip(s["baseline"]["mean"], s["baseline"]["base"])] for s in seeds]
        else:
            per_seed = [[a - b for a, b in zip(s["population"][mine], s[ref_arm][ref])] for s in seeds]
        clusters = [list(col) for col in zip(*per_seed)]
        for label in ["all", *sorted(set(levels))]:
            chosen = [(c, lv) for c, lv in zip(clusters, levels) if label in ("all", lv)]
            cs, strata = [c for c, _ in chosen], [lv for _, lv in chosen]
            low, high = cluster_bootstrap(cs, strata=strata if label == "all" else None)
            rows.append({"claim": name, "level": label, "mean": sum(map(sum, cs)) / sum(map(len, cs)),
                         "low": low, "high": high, "mde": cluster_mde(cs), "problems": len(cs)})  # fmt: skip
    return rows


def seeds_mde(values: Sequence[float | None]) -> float | None:
    """The detectable mean of run-level values over seeds (paired differences, or one arm's values against 0):
    the t-interval's half-width plus ``z_0.8`` standard errors (80 % power at a two-sided 5 %)."""
    xs = [v for v in values if v is not None]
    if len(xs) < 2 or statistics.stdev(xs) == 0:
        return None
    pooled = dynamics.pooled(xs)
    return (pooled["high"] - pooled["mean"]) + statistics.NormalDist().inv_cdf(0.8) * statistics.stdev(xs) / math.sqrt(
        len(xs)
    )


#: Run-level claims: (name, measure of dynamics.measure_run, how it is read)
RUN_CLAIMS: list[tuple[str, str, str]] = [
    ("teacher difficulty slope (levels a step)", "difficulty_slope", "the single agent's self-calibration: <= 0"),
    ("solve-rate swings", "oscillation/swings", "against their shuffled-steps null below"),
    ("solve-rate swings, shuffled steps (null)", "oscillation/swings_shuffled", "the same series, order destroyed"),
    ("new task signatures a step (last third)", "coverage/new_per_step", "coverage keeps growing: > 0"),
    ("training-time solve rate", "train/solve_rate", "students' samples, every step"),
    ("training-time reward", "train/reward", "every member, every step"),
]


def run_claims(rows: Sequence[dict[str, Any]], value: Callable[[dict[str, Any], str, str], float | None]) -> list[dict]:
    """Each run-level claim per arm (mean over seeds [95 % t-interval], detectable) and population - single agent
    paired by seed. ``value(row, arm, measure)`` reads one run's measure."""
    out = []
    for name, key, reading in RUN_CLAIMS:
        arms = {arm: [value(r, arm, key) for r in rows] for arm in ("population", "baseline")}
        diffs = [a - b for a, b in zip(arms["population"], arms["baseline"]) if a is not None and b is not None]
        out.append({
            "claim": name, "measure": key, "reading": reading,
            **{arm: {**dynamics.pooled(v), "mde": seeds_mde(v)} for arm, v in arms.items()},
            "difference": {**dynamics.pooled(diffs), "mde": seeds_mde(diffs)},
        })  # fmt: skip
    return out


def _interval(v: dict[str, Any], scale: float = 1.0, fmt: str = "+.1f") -> str:
    if v.get("mean") is None:
        return "-"
    text = format(scale * v["mean"], fmt)
    return text if v.get("low") is None else f"{text} [{scale * v['low']:{fmt}}, {scale * v['high']:{fmt}}]"


def _mde(v: float | None, scale: float = 1.0, fmt: str = ".1f") -> str:
    return "-" if v is None else format(scale * v, fmt)


def table(heldout: list[dict[str, Any]], runs: list[dict[str, Any]], seeds: int, benchmark: str) -> str:
    """The claims table (markdown): held-out rows in points, then the run-level rows."""
    lines = [
        f"## The paper's claims ({seeds} seed(s) per arm; held-out `{benchmark}`, per sample, k = {K})",
        "",
        "| claim | level | difference (points) [95 % CI] | detectable (80 % power) | problems |",
        "|---|---|---|---|---|",
    ]
    for r in heldout:
        lines.append(f"| {r['claim']} | {r['level']} | {_interval(r, 100)} | {_mde(r['mde'], 100)} | {r['problems']} |")
    lines += [
        "",
        "| run-level claim | population [95 % CI] | single agent [95 % CI] | population - single [95 % CI] | "
        "detectable (pop / single / diff) | reading |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        fmt = "+.4f" if "slope" in r["measure"] else ".3f"
        p, b, d = r["population"], r["baseline"], r["difference"]
        detectable = " / ".join(_mde(x["mde"], 1, ".3g") for x in (p, b, d))
        lines.append(
            f"| {r['claim']} | {_interval(p, 1, fmt)} | {_interval(b, 1, fmt)} | {_interval(d, 1, fmt)} | "
            f"{detectable} | {r['reading']} |"
        )
    return "\n".join(lines) + "\n"
