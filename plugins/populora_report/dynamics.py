"""The paper's four dynamics as numbers: pure functions over a run's log records, no matplotlib.

Inputs are the records the loop writes: step records of ``events.jsonl``, ``tasks/problems.jsonl`` and
``probe.jsonl`` (lists of dicts). Each measure takes the records of one run; :func:`pooled` turns the
per-seed values of an arm into a mean with a 95 % t-interval over seeds, the unit that varies between
repetitions of the experiment (problems and steps within a run are not independent draws).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

COMPLEXITY_METRICS = ("ast_depth", "cyclomatic", "loc")

# two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom (beyond: the normal's 1.96)
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) else float(value)


def slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ys over xs; None with fewer than two distinct xs."""
    if len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def _detrend(xs: Sequence[float], ys: Sequence[float]) -> list[float]:
    b = slope(xs, ys) or 0.0
    a = statistics.fmean(ys) - b * statistics.fmean(xs)
    return [y - (a + b * x) for x, y in zip(xs, ys)]


# --- teacher program complexity ----------------------------------------------------------------


def teacher_program(problem: dict[str, Any]) -> bool:
    """Whether a problem record's program was written by its teacher: what the task wrote (``teacher_program``; AZR's
    induction takes its programs from the buffers); a record without it (a task that writes no programs) counts."""
    return problem.get("teacher_program") is not False


def complexity_series(problems: Iterable[dict[str, Any]], metric: str) -> tuple[list[int], list[float]]:
    """Per step, the mean of ``metric_<metric>`` over that step's valid proposals whose program the teacher wrote
    (all teachers; AZR: deduction and abduction, not induction, whose programs come from the buffers)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for p in problems:
        value = _number(p.get(f"metric_{metric}"))
        if p.get("valid") and value is not None and isinstance(p.get("step"), int) and teacher_program(p):
            by_step[p["step"]].append(value)
    xs = sorted(by_step)
    return xs, [statistics.fmean(by_step[x]) for x in xs]


def complexity_trend(problems: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Slope per step of each complexity metric's per-step mean over valid teacher-written proposals.

    Per-step means, not single proposals, so that every step weighs the same: validity changes over a
    run, and a fit over proposals would let the steps with many valid programs set the trend.
    """
    return {m: slope(*complexity_series(problems, m)) for m in COMPLEXITY_METRICS}


# --- solve-rate oscillation --------------------------------------------------------------------


def solve_rate_series(steps: Iterable[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """(step, solve rate of all students' solver samples) of every step record that has one."""
    xs, ys = [], []
    for rec in steps:
        value = _number(rec.get("solve_rate"))
        if value is not None and isinstance(rec.get("step"), int):
            xs.append(rec["step"])
            ys.append(value)
    return xs, ys


def oscillation(
    xs: Sequence[float], ys: Sequence[float], *, window: int = 5, z: float = 3.0, floor: float = 0.01
) -> dict[str, Any]:
    """Swings of a series around its linear trend: their number, rate per 100 steps and mean amplitude.

    1. Detrend with the least-squares line: a steady rise or fall is a trend, not an oscillation.
    2. Estimate the step-to-step noise from first differences, sigma = sd(diff(residual)) / sqrt(2): for
       independent noise each difference has twice its variance, while a swing lasting several steps
       barely moves consecutive values, so the swing itself hardly inflates the estimate.
    3. Smooth the residual with a moving mean over ``window`` steps (full windows only) and count with
       hysteresis: the series is *high* once it exceeds +h and *low* once below -h, with
       h = max(z * sigma / sqrt(window), floor), z standard errors of a window mean of pure noise; each
       change between high and low is one swing, its amplitude the distance between the extreme of the
       excursion it leaves and the extreme of the one it enters (peak to trough).

    So a flat or merely noisy series has no swings (noise rarely carries a window mean across 2h), and a
    sine of period P over N steps has about 2N/P. ``floor`` (solve-rate units) is the smallest swing
    worth a name: a step's few dozen solver samples cannot resolve one percentage point.
    None values when the series is too short to smooth and difference (fewer than window + 2 points).
    """
    n = len(ys)
    if n < window + 2:
        return {"swings": None, "swings_per_100_steps": None, "amplitude": None, "threshold": None}
    residual = _detrend(xs, ys)
    sigma = statistics.stdev(b - a for a, b in itertools.pairwise(residual)) / math.sqrt(2)
    smooth = [statistics.fmean(residual[i : i + window]) for i in range(n - window + 1)]
    h = max(z * sigma / math.sqrt(window), floor)
    excursions: list[tuple[int, float]] = []  # (side, extreme) of each excursion beyond +-h, in order
    for value in smooth:
        side = 1 if value > h else -1 if value < -h else 0
        if not side:
            continue
        if excursions and excursions[-1][0] == side:
            excursions[-1] = (side, max(excursions[-1][1], value) if side > 0 else min(excursions[-1][1], value))
        else:
            excursions.append((side, value))
    amplitudes = [abs(b - a) for (_, a), (_, b) in itertools.pairwise(excursions)]
    span = (max(xs) - min(xs)) or 1
    return {
        "swings": len(amplitudes),
        "swings_per_100_steps": 100 * len(amplitudes) / span,
        "amplitude": statistics.fmean(amplitudes) if amplitudes else 0.0,
        "threshold": h,
    }


# --- problem-space coverage --------------------------------------------------------------------


def coverage_series(
    problems: Iterable[dict[str, Any]], steps: Iterable[int] = ()
) -> tuple[list[int], list[int], list[int]]:
    """Per step: (step, signatures of valid proposals never seen before in the run, valid proposals).

    ``steps`` adds steps that logged no valid proposal (they count, with nothing new).
    """
    seen_at: dict[str, int] = {}
    valid: dict[int, int] = dict.fromkeys(steps, 0)
    for p in sorted((p for p in problems if isinstance(p.get("step"), int)), key=lambda p: p["step"]):
        valid.setdefault(p["step"], 0)
        if p.get("valid"):
            valid[p["step"]] += 1
            if p.get("signature"):
                seen_at.setdefault(p["signature"], p["step"])
    new: dict[int, int] = defaultdict(int)
    for step in seen_at.values():
        new[step] += 1
    xs = sorted(valid)
    return xs, [new[x] for x in xs], [valid[x] for x in xs]


def coverage_growth(problems: Sequence[dict[str, Any]], steps: Iterable[int] = ()) -> dict[str, Any]:
    """New distinct task signatures per step in the last third of the run, and per valid proposal.

    The last third, because early in a run every signature is new; whether coverage *keeps* expanding
    shows late. Per valid proposal as well, because arms propose different numbers of problems per step
    (a 2T population proposes more than one single agent): that rate compares novelty, not volume.
    """
    xs, new, valid = coverage_series(problems, steps)
    if not xs:
        return {"new_per_step": None, "new_per_valid_proposal": None, "distinct": 0, "last_third_from": None}
    first = max(xs) - max(1, (max(xs) - min(xs) + 1) // 3) + 1  # a run of 1 or 2 steps: its last step
    late = [(n, v) for x, n, v in zip(xs, new, valid) if x >= first]
    late_valid = sum(v for _, v in late)
    return {
        "new_per_step": statistics.fmean(n for n, _ in late),
        "new_per_valid_proposal": sum(n for n, _ in late) / late_valid if late_valid else None,
        "distinct": sum(new),
        "last_third_from": first,
    }


# --- probe accuracy ----------------------------------------------------------------------------


def probe_accuracy(probe: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Base and final students' probe accuracy (n-weighted over task types) with their mean, best, weakest.

    The students are those probed at the last step that probed any; the base is its latest probe.
    """
    sums: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for rec in probe:
        acc, step, member = _number(rec.get("accuracy")), rec.get("step"), rec.get("member")
        if acc is None or not isinstance(step, int) or not member:
            continue
        n = max(int(_number(rec.get("n")) or 1), 1)
        sums[(step, str(member))][0] += acc * n
        sums[(step, str(member))][1] += n
    overall = {key: total / n for key, (total, n) in sums.items()}
    base_steps = [s for s, m in overall if m == "base"]
    student_steps = [s for s, m in overall if m != "base"]
    last = max(student_steps, default=None)
    students = {m: acc for (s, m), acc in overall.items() if s == last and m != "base"}
    return {
        "base": overall[(max(base_steps), "base")] if base_steps else None,
        "students": students,
        "step": last,
        "mean": statistics.fmean(students.values()) if students else None,
        "best": max(students.values(), default=None),
        "weakest": min(students.values(), default=None),
    }


# --- one run, and an arm pooled over seeds ------------------------------------------------------


def shuffled_swings(xs: Sequence[float], ys: Sequence[float], *, shuffles: int = 200, seed: int = 0) -> float | None:
    """The null of :func:`oscillation`'s swing count: its mean over ``shuffles`` random orders of the same values
    at the same steps (trend and noise kept, any order in time destroyed). Swings above it are order in time."""
    import random

    if len(ys) < 7:
        return None
    rng, values, counts = random.Random(seed), list(ys), []
    for _ in range(shuffles):
        rng.shuffle(values)
        counts.append(oscillation(xs, values)["swings"])
    return statistics.fmean(counts)


def difficulty_slope(problems: Sequence[dict[str, Any]]) -> float | None:
    """Slope per step of the teachers' mean proposal difficulty (``metric_level`` of valid proposals, a task that
    reports levels: the arithmetic world); None for tasks without one."""
    return slope(*complexity_series(problems, "level"))


def training_rewards(steps: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """The run's mean training-time solve rate (every student's solver samples, every step) and mean member
    reward (``member/<id>/reward`` over members and steps): what each arm optimised, as it saw it."""
    solve = [v for v in (_number(r.get("solve_rate")) for r in steps) if v is not None]
    rewards = [
        v
        for r in steps
        for k, value in r.items()
        if k.startswith("member/") and k.endswith("/reward") and (v := _number(value)) is not None
    ]
    return {
        "train/solve_rate": statistics.fmean(solve) if solve else None,
        "train/reward": statistics.fmean(rewards) if rewards else None,
    }


def measure_run(
    steps: Sequence[dict[str, Any]], problems: Sequence[dict[str, Any]], probe: Sequence[dict[str, Any]]
) -> dict[str, float | None]:
    """Every measure of one run as a flat ``name -> value`` mapping (what :func:`pool` averages)."""
    step_numbers = [r["step"] for r in steps if isinstance(r.get("step"), int)]
    out: dict[str, float | None] = {f"complexity_slope/{k}": v for k, v in complexity_trend(problems).items()}
    out["difficulty_slope"] = difficulty_slope(problems)
    series = solve_rate_series(steps)
    swings = oscillation(*series)
    out.update({f"oscillation/{k}": swings[k] for k in ("swings", "swings_per_100_steps", "amplitude")})
    out["oscillation/swings_shuffled"] = shuffled_swings(*series)
    out.update(training_rewards(steps))
    coverage = coverage_growth(problems, step_numbers)
    out.update({f"coverage/{k}": coverage[k] for k in ("new_per_step", "new_per_valid_proposal")})
    accuracy = probe_accuracy(probe)
    out.update({f"probe/{k}": accuracy[k] for k in ("base", "mean", "best", "weakest")})
    return out


def pooled(values: Iterable[float | None]) -> dict[str, Any]:
    """Mean over seeds with a 95 % t-interval (None bounds with a single value; Nones are left out)."""
    xs = [v for v in values if v is not None]
    if not xs:
        return {"mean": None, "low": None, "high": None, "n": 0}
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return {"mean": mean, "low": None, "high": None, "n": 1}
    half = (_T975[len(xs) - 2] if len(xs) - 1 <= len(_T975) else 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": len(xs)}


def pool(runs: Sequence[dict[str, float | None]]) -> dict[str, dict[str, Any]]:
    """Each measure of :func:`measure_run` pooled over runs (the seeds of one arm)."""
    keys = list(dict.fromkeys(k for r in runs for k in r))
    return {k: pooled(r.get(k) for r in runs) for k in keys}
