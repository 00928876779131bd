"""The study's measures on synthetic logs: each finds a planted trend or oscillation and nothing on a flat log."""

from __future__ import annotations

import math
import random

import pytest
from populora_report.dynamics import (
    complexity_series,
    complexity_trend,
    coverage_growth,
    difficulty_slope,
    measure_run,
    oscillation,
    pool,
    pooled,
    probe_accuracy,
    shuffled_swings,
    solve_rate_series,
    training_rewards,
)

STEPS = list(range(1, 121))


def _problems(depth_slope: float, seed: int, per_step: int = 6) -> list[dict]:
    """Valid proposals whose AST depth rises by ``depth_slope`` a step (with noise); invalid ones are outliers."""
    rng = random.Random(seed)
    out = []
    for step in STEPS:
        for k in range(per_step):
            depth = 3 + depth_slope * step + rng.gauss(0, 0.5)
            out.append(
                {"step": step, "valid": True, "signature": f"s{step % 7}-{k}", "metric_ast_depth": depth}
                | {"metric_cyclomatic": 2.0, "metric_loc": 4 + 2 * depth_slope * step}
            )
        out.append({"step": step, "valid": False, "signature": "x", "metric_ast_depth": 100.0 * (step % 2)})
    return out


def _steps(rates: list[float]) -> list[dict]:
    return [{"event": "step", "step": s, "solve_rate": r} for s, r in zip(STEPS, rates)]


def _sine(seed: int, amplitude: float = 0.15, period: float = 20) -> list[float]:
    rng = random.Random(seed)
    return [0.4 + 0.001 * s + amplitude * math.sin(2 * math.pi * s / period) + rng.gauss(0, 0.03) for s in STEPS]


def test_complexity_trend_finds_a_planted_rise_and_no_rise_on_a_flat_log():
    rising = complexity_trend(_problems(0.02, seed=0))
    assert rising["ast_depth"] == pytest.approx(0.02, abs=0.004)
    assert rising["loc"] == pytest.approx(0.04, abs=1e-9) and rising["cyclomatic"] == pytest.approx(0.0)
    flat = complexity_trend(_problems(0.0, seed=0))
    assert abs(flat["ast_depth"]) < 0.004
    # pooled over three seeds: the interval excludes zero for the rise and holds zero for the flat log
    up = pooled(complexity_trend(_problems(0.02, seed=s))["ast_depth"] for s in range(3))
    none = pooled(complexity_trend(_problems(0.0, seed=s))["ast_depth"] for s in range(3))
    assert 0 < up["low"] < 0.02 < up["high"]
    assert none["low"] < 0 < none["high"]


def test_complexity_counts_only_the_programs_the_teachers_wrote():
    """Induction programs come from the pool: a falling induction depth must not pull the teachers' series down."""
    rising = _problems(0.02, seed=0)
    pool = [
        {
            "step": s,
            "valid": True,
            "task_type": "induction",
            "teacher_program": False,
            "metric_ast_depth": 9.0 - 0.05 * s,
        }
        for s in STEPS
    ]
    written = [{**p, "task_type": "deduction", "teacher_program": True} for p in rising]
    assert complexity_series(rising + pool, "ast_depth") == complexity_series(rising, "ast_depth")
    assert complexity_trend(written + pool)["ast_depth"] == pytest.approx(0.02, abs=0.004)
    # what decides is the record's flag, never the task type's name: without one a record counts
    for task_type in ("count", "induction"):
        other = [{"step": 1, "valid": True, "task_type": task_type, "metric_ast_depth": 50.0}]
        assert complexity_series(other, "ast_depth") == ([1], [50.0])
        assert complexity_series([{**other[0], "teacher_program": False}], "ast_depth") == ([], [])


def test_oscillation_counts_the_swings_of_a_planted_sine():
    for seed in range(3):
        result = oscillation(*solve_rate_series(_steps(_sine(seed))))
        # a period of 20 over 120 steps: 12 half-periods, the first and last cut by the smoothing window
        assert result["swings"] == 11
        # peak to trough 0.30, a little less after the 5-step moving mean (gain 0.90 at period 20)
        assert 0.22 < result["amplitude"] < 0.32
        assert result["swings_per_100_steps"] == pytest.approx(100 * 11 / 119)


def test_oscillation_reports_none_on_flat_noisy_and_trending_logs():
    flat = oscillation(STEPS, [0.3] * len(STEPS))
    assert flat["swings"] == 0 and flat["amplitude"] == 0.0
    noisy = [oscillation(STEPS, [0.4 + random.Random(s).gauss(0, 0.08) for _ in STEPS])["swings"] for s in range(20)]
    assert sum(noisy) <= 1  # about 1 in 100 noise logs shows one swing
    rng = random.Random(5)
    ramp = oscillation(STEPS, [0.1 + 0.005 * s + rng.gauss(0, 0.02) for s in STEPS])
    assert ramp["swings"] == 0  # the trend is removed first
    # a slower, smaller oscillation is still found, with fewer swings than the fast one
    slow = oscillation(STEPS, _sine(0, amplitude=0.08, period=40))
    assert 4 <= slow["swings"] <= 6
    assert oscillation(STEPS[:6], [0.1, 0.5, 0.1, 0.5, 0.1, 0.5])["swings"] is None  # too short to smooth


def test_coverage_growth_counts_new_signatures_in_the_last_third():
    problems = []
    for step in STEPS:
        # one new signature a step early on; from step 81 (the last third of 120) two new ones a step
        new = [f"late-{step}-a", f"late-{step}-b"] if step >= 81 else [f"early-{step}"]
        for sig in [*new, "common", "common"]:
            problems.append({"step": step, "valid": True, "signature": sig})
        problems.append({"step": step, "valid": False, "signature": f"invalid-{step}"})
    growth = coverage_growth(problems, STEPS)
    assert growth["last_third_from"] == 81
    assert growth["new_per_step"] == 2.0 and growth["new_per_valid_proposal"] == pytest.approx(2 / 4)
    assert growth["distinct"] == 80 + 2 * 40 + 1
    # a population that stopped finding new problems: nothing new late, whatever it found early
    saturated = [p for p in problems if not str(p["signature"]).startswith("late")]
    late_steps = coverage_growth(saturated, STEPS)
    assert late_steps["new_per_step"] == 0.0 and late_steps["new_per_valid_proposal"] == 0.0
    assert coverage_growth([], [])["new_per_step"] is None
    two_steps = coverage_growth([p for p in problems if p["step"] <= 2], [1, 2])
    assert two_steps["last_third_from"] == 2 and two_steps["new_per_step"] == 1.0


def _probe(step, member, by_type, n=10):
    return [{"step": step, "member": member, "task_type": t, "accuracy": a, "n": n} for t, a in by_type.items()]


def test_probe_accuracy_reads_base_and_final_students():
    records = _probe(0, "base", {"deduction": 0.1, "induction": 0.3})
    records += _probe(0, "s0", {"deduction": 0.1, "induction": 0.3})
    records += _probe(120, "s0", {"deduction": 0.2, "induction": 0.4})
    records += _probe(120, "s3", {"deduction": 0.3, "induction": 0.5}, n=30)
    acc = probe_accuracy(records)
    assert acc["step"] == 120 and acc["base"] == pytest.approx(0.2)
    assert acc["students"] == pytest.approx({"s0": 0.3, "s3": 0.4})
    assert (acc["mean"], acc["best"], acc["weakest"]) == pytest.approx((0.35, 0.4, 0.3))
    assert probe_accuracy([])["mean"] is None


def test_pooled_t_interval_and_measure_run():
    assert pooled([1.0, 2.0, 3.0]) == pytest.approx(
        {"mean": 2.0, "low": 2 - 4.303 / 3**0.5, "high": 2 + 4.303 / 3**0.5, "n": 3}
    )
    assert pooled([0.5, None]) == {"mean": 0.5, "low": None, "high": None, "n": 1}
    assert pooled([None]) == {"mean": None, "low": None, "high": None, "n": 0}
    runs = [
        measure_run(_steps(_sine(s)), _problems(0.02, s), _probe(120, "s0", {"deduction": 0.2 + 0.1 * s}))
        for s in range(3)
    ]
    assert runs[0]["oscillation/swings"] == 11 and runs[0]["probe/base"] is None
    arm = pool(runs)
    assert arm["probe/mean"]["mean"] == pytest.approx(0.3) and arm["probe/mean"]["n"] == 3
    assert arm["oscillation/swings"] == {"mean": 11.0, "low": 11.0, "high": 11.0, "n": 3}
    assert arm["complexity_slope/ast_depth"]["low"] > 0


def test_swings_of_an_oscillation_stand_above_their_shuffled_null_and_noise_does_not():
    sine = _sine(0)
    assert oscillation(STEPS, sine)["swings"] >= 2 * shuffled_swings(STEPS, sine) + 4
    rng = random.Random(1)
    noise = [0.4 + rng.gauss(0, 0.05) for _ in STEPS]
    assert abs(oscillation(STEPS, noise)["swings"] - shuffled_swings(STEPS, noise)) <= 2
    assert shuffled_swings(STEPS[:5], sine[:5]) is None


def test_difficulty_slope_reads_the_levels_of_valid_proposals_only():
    problems = [
        {"step": s, "valid": True, "metric_level": 2 + 0.05 * s + (k % 3 - 1) * 0.1} for s in STEPS for k in range(4)
    ]
    problems += [{"step": s, "valid": False, "metric_level": 6} for s in STEPS if s % 2]
    assert difficulty_slope(problems) == pytest.approx(0.05)
    assert difficulty_slope(_problems(0.02, seed=0)) is None  # an AZR run reports no level


def test_training_rewards_average_every_member_and_step():
    steps = [
        {"step": 1, "solve_rate": 0.2, "member/t0/reward": -0.5, "member/s0/reward": 0.5, "member/s0/rating_mu": 9},
        {"step": 2, "solve_rate": 0.4, "member/t0/reward": 0.5, "member/s0/reward": None},
    ]
    assert training_rewards(steps) == {"train/solve_rate": pytest.approx(0.3), "train/reward": pytest.approx(1 / 6)}
