"""The study's summary of recorded runs: the best student's gain over the base with its paired interval, and
the whole study (pooled over seeds, its report page) from finished run directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.research.study import main, paired_gain_interval, summarize
from tests.synthetic_runs import write_run


def _write_probe(run_dir, records):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "probe.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")


def _record(step, member, task_type, correct, with_outcomes=True):
    rec = {
        "step": step,
        "member": member,
        "version": member,
        "role": "student",
        "task_type": task_type,
        "accuracy": sum(correct) / len(correct),
        "n": len(correct),
    }
    if with_outcomes:
        rec["correct"] = correct
    return rec


def test_identical_outcomes_give_a_zero_width_interval():
    outcomes = {"deduction": [1, 0, 0, 1], "induction": [0, 1, 1, 1]}
    assert paired_gain_interval(outcomes, dict(outcomes)) == (0.0, 0.0)


def test_interval_is_paired_stratified_and_seeded():
    base = {"a": [0] * 20 + [1] * 20, "b": [0] * 40}
    # the member solves 8 more problems of type a and loses none: every resample gains, by 0 to 20 points / 2
    better = {"a": [1] * 8 + [0] * 12 + [1] * 20, "b": [0] * 40}
    low, high = paired_gain_interval(better, base, seed=3)
    assert 0 < low < 0.1 < high <= 0.2
    assert paired_gain_interval(better, base, seed=3) == (low, high)
    # a member that trades problems (as many won as lost) is not distinguishable from the base
    traded = {"a": [1] * 8 + [0] * 12 + [0] * 8 + [1] * 12, "b": [0] * 40}
    low, high = paired_gain_interval(traded, base)
    assert low < 0 < high


def test_interval_needs_outcomes_for_every_task_type():
    assert paired_gain_interval({"a": [1, 0]}, {"a": [1, 0], "b": [0, 1]}) is None
    assert paired_gain_interval({"a": [1, 0, 1]}, {"a": [1, 0]}) is None


def test_summarize_reads_the_best_student_and_its_interval(tmp_path):
    run = tmp_path / "run"
    base = {"deduction": [0, 0, 1, 0, 0, 1], "abduction": [1, 0, 0, 0, 1, 0]}
    s0 = {"deduction": [1, 1, 1, 0, 0, 1], "abduction": [1, 0, 1, 0, 1, 0]}
    s1 = {"deduction": [0, 0, 1, 0, 0, 0], "abduction": [1, 0, 0, 0, 1, 0]}
    records = [_record(0, "base", t, c) for t, c in base.items()]
    records += [_record(8, m, t, c) for m, member in (("s0", s0), ("s1", s1)) for t, c in member.items()]
    _write_probe(run, records)
    summary = summarize(run)
    assert summary["best"] == pytest.approx((4 / 6 + 3 / 6) / 2)
    assert summary["base_accuracy"] == pytest.approx((2 / 6 + 2 / 6) / 2)
    low, high = summary["best_gain_interval"]
    assert low <= summary["best"] - summary["base_accuracy"] <= high
    assert summary["best_gain_interval"] == paired_gain_interval(s0, base)

    # runs recorded before per-problem outcomes were written still summarise, without an interval
    _write_probe(run, [{k: v for k, v in r.items() if k != "correct"} for r in records])
    assert summarize(run)["best_gain_interval"] is None


def test_the_long_study_reads_finished_runs_pools_seeds_and_writes_its_report(tmp_path):
    """Finished runs (a summary.json each) are read, not rerun: the study's tables from recorded logs."""
    for seed in range(3):
        pop = write_run(tmp_path / f"population-seed{seed}", seed=seed, depth_slope=0.02, swing=0.15)
        single = write_run(
            tmp_path / f"baseline-seed{seed}",
            name="single",
            mode="single_agent",
            seed=seed,
            students={"a0": 0.2 + 0.01 * seed},
        )
        for run_dir in (pop, single):
            (run_dir / "summary.json").write_text("{}")
    summary = main(["--recipe", "long", "--seeds", "0", "1", "2", "--out", str(tmp_path)])
    text = (tmp_path / "study.md").read_text()
    assert "Recipes `nano_long.yaml` and `nano_long_single_agent.yaml`, seeds 0, 1, 2" in text
    assert summary["population_mean"] == pytest.approx(0.275) and summary["single_agent"] == pytest.approx(0.21)
    assert summary["mean_minus_single"] == pytest.approx(
        {"mean": 0.065, "low": 0.065 - 0.01 * 4.303 / 3**0.5, "high": 0.065 + 0.01 * 4.303 / 3**0.5, "n": 3}
    )
    assert summary["depth_slope_population"]["low"] > 0 > summary["depth_slope_single_agent"]["low"]
    assert summary["swings_population"]["mean"] > 3 and summary["swings_single_agent"]["mean"] == 0
    assert summary["new_signatures_per_step_population"]["mean"] == 2.0
    study_json = json.loads((tmp_path / "study.json").read_text())
    assert study_json["paired"]["oscillation/swings_minus_single"]["mean"] == summary["swings_population"]["mean"]
    assert Path(summary["report"]) == tmp_path / "report" / "report.html"
    page = Path(summary["report"]).read_text()
    assert "synthetic-2t2s: 3 run(s), seeds 0, 1, 2" in page and "single: 3 run(s)" in page


def _figures_not_drawn(monkeypatch) -> list[tuple[list[Path], Path]]:
    """The study's report page left out: (run folders, report folder) of each render it would have made. Its figures
    (matplotlib, ~10 s a study) are drawn and checked in test_the_long_study_reads_finished_runs_pools_seeds_and_writes
    _its_report and the study smoke of tests/benchmarks/test_benchmarks.py; a test that reads none of it skips them."""
    import benchmarks.research.study as study_module

    rendered: list[tuple[list[Path], Path]] = []

    def render_report(run_dirs, out):
        rendered.append(([Path(d) for d in run_dirs], Path(out)))
        return Path(out) / "report.html"

    monkeypatch.setattr(study_module, "render_report", render_report)
    return rendered


def _synthetic_study(out: Path, students: dict[str, float], selection: dict | None = None) -> None:
    for seed in range(3):
        pop = write_run(out / f"population-seed{seed}", seed=seed, students=students)
        single = write_run(out / f"baseline-seed{seed}", name="single", mode="single_agent", seed=seed)
        (pop / "summary.json").write_text(json.dumps({"selection": selection}))
        (single / "summary.json").write_text("{}")
    main(["--seeds", "0", "1", "2", "--out", str(out)])


def test_compare_pairs_an_ablation_with_its_reference_by_seed(tmp_path, monkeypatch):
    """An ablation that raises every student by 5 points moves the population's probe by +5 [5, 5], the single
    agent's (unchanged) by 0; the per-seed selection row of the study names what selection did."""
    selection = {
        "replacements_after_first": 12,
        "youngest_replaced": 4,
        "youngest_replaced_by_chance": 6.0,
        "survivor_changes": 8,
        "survivor_comparisons": 12,
    }
    rendered = _figures_not_drawn(monkeypatch)
    _synthetic_study(tmp_path / "reference", {"s0": 0.20, "s1": 0.30}, selection)
    _synthetic_study(tmp_path / "ablation", {"s0": 0.25, "s1": 0.35})
    runs = [f"{arm}-seed{seed}" for arm in ("population", "baseline") for seed in range(3)]
    assert rendered == [([tmp_path / s / r for r in runs], tmp_path / s / "report") for s in ("reference", "ablation")]
    assert (
        "seed 0: 4 of 12 replacements after the first hit the youngest member (chance 6.0)"
        in (tmp_path / "reference" / "study.md").read_text()
    )
    result = main(["--compare", str(tmp_path / "reference"), str(tmp_path / "ablation")])
    moved = result["population/probe/mean_minus_reference"]
    assert moved["mean"] == pytest.approx(0.05) and moved["low"] == pytest.approx(0.05)
    assert result["baseline/probe/mean_minus_reference"]["mean"] == 0
    assert (
        "| probe/best | population | 30.0 [30.0, 30.0] | 35.0 [35.0, 35.0] | 5.0 [5.0, 5.0] |"
        in (tmp_path / "ablation" / "compare.md").read_text()
    )
    with pytest.raises(SystemExit, match="share no seed"):
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "study.json").write_text(json.dumps({"rows": [{"seed": 7}]}))
        main(["--compare", str(tmp_path / "reference"), str(tmp_path / "other")])


def test_pooled_differences_resample_problems_with_the_seeds_nested():
    """Two seeds, two problems: in both seeds the best student wins problem 0 and ties problem 1, and the
    population's mean student beats the single agent the same way. Problems are the unit: the resamples
    are {0, 0}, {0, 1}, {1, 1}, so the 95 % interval is [0, +1], not the pooled four (seed, problem) pairs'."""
    from benchmarks.research.study import problem_level

    def arm(students):
        return {"problems": {"base": {"greedy": [0.0, 0.0]}, "strata": ["a", "a"], **students}}

    pop = arm({"s0": {"greedy": [1.0, 0.0]}, "s1": {"greedy": [0.0, 0.0]}})
    single = arm({"a0": {"greedy": [0.0, 0.0]}})
    nested = problem_level([{"population": pop, "baseline": single}] * 2)
    best = nested["greedy/best_minus_base"]
    assert (best["mean"], best["low"], best["high"], best["problems"]) == (0.5, 0.0, 1.0, 2)
    assert nested["greedy/mean_minus_single"]["mean"] == 0.25 and "sampled/best_minus_base" not in nested
    # the design's detectable difference: 2.80 x sd of the two problems' mean differences (1 and 0) / sqrt(2)
    assert best["mde"] == pytest.approx(2.8016 * 0.5**0.5 / 2**0.5, abs=1e-3)


@pytest.mark.slow
def test_an_ablation_of_one_arm_reuses_the_other_arms_runs_and_compares_by_seed(tmp_path, monkeypatch):
    """The arithmetic world's ablation path, as the README types it: a study, then one whose population arm runs
    with cross-evaluation off while the single agent's runs are linked from the first; --compare pairs them,
    held-out accuracy included. Smoke sizes: that the path runs, not what it measures."""
    reference, ablation = tmp_path / "study", tmp_path / "no-xeval"
    main(["--recipe", "arith", "--smoke", "--out", str(reference)])  # with its report page: the path as typed
    assert (reference / "report" / "report.html").is_file()
    rendered = _figures_not_drawn(monkeypatch)  # the two studies below: their pages are not read
    overrides = ["--population-overrides", "population.cross_evaluation=false"]
    main(["--recipe", "arith", "--smoke", "--out", str(ablation), "--reuse-baseline", str(reference), *overrides])
    assert (ablation / "baseline-seed0").is_symlink()
    assert (ablation / "baseline-seed0").resolve() == (reference / "baseline-seed0").resolve()
    recipe = (ablation / "population-seed0" / "recipe.yaml").read_text()
    assert "cross_evaluation: false" in recipe
    assert "cross_evaluation: true" in (reference / "population-seed0" / "recipe.yaml").read_text()
    rows = json.loads((ablation / "study.json").read_text())["rows"]
    assert {"mean", "best", "weakest"} <= set(rows[0]["population"]["heldout"])
    result = main(["--compare", str(reference), str(ablation)])
    assert result["baseline/heldout/mean_minus_reference"]["mean"] == 0  # the same runs
    assert "population mean - single agent" in (ablation / "study.md").read_text()
    # the other way round: another single agent (here more answers a question) against the same population runs
    other = tmp_path / "other-baseline"
    more = ["--baseline-overrides", "rollout.solver_samples=3"]
    main(["--recipe", "arith", "--smoke", "--out", str(other), "--reuse-population", str(reference), *more])
    assert (other / "population-seed0").resolve() == (reference / "population-seed0").resolve()
    assert "solver_samples: 3" in (other / "baseline-seed0" / "recipe.yaml").read_text()
    assert "solver_samples: 3" not in (reference / "baseline-seed0" / "recipe.yaml").read_text()
    runs = ("population-seed0", "baseline-seed0")
    assert rendered == [([study / r for r in runs], study / "report") for study in (ablation, other)]
