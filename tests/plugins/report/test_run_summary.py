"""The end of a run: the summary table from a recorded run, and what `populora run` prints and writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from populora_report.summary import format_summary, paired_gain_interval, run_summary, write_summary

from populora_core.services.statistics import min_detectable_effect
from tests.cli_helpers import invoke_cli, run_cli
from tests.synthetic_runs import write_run

TESTS = Path(__file__).resolve().parents[2]
FAKE = str(TESTS / "fake_stack.py")
RECIPE = str(TESTS / "recipes" / "fake_2t2s.yaml")


def test_summary_of_a_recorded_run(tmp_path):
    run_dir = write_run(tmp_path / "run", steps=12, students={"s0": 0.3, "s3": 0.35}, base=0.2, children=2)
    summary = run_summary(run_dir, wall_s=31.4)
    assert summary["steps"] == summary["planned_steps"] == 12
    assert summary["wall_s"] == 31.4 and summary["step_s"] == pytest.approx(12 * 2.0)
    assert summary["children_born"] == 2 and summary["probe_step"] == 12
    assert summary["base_accuracy"] == pytest.approx(0.2)
    assert summary["students"] == pytest.approx({"s3@v12": 0.35, "s0@v12": 0.3})
    assert list(summary["students"]) == ["s3@v12", "s0@v12"]  # best first
    assert summary["best_minus_base"] == pytest.approx(0.15)
    assert summary["report_command"] == f"populora report {run_dir}"
    table = format_summary(summary).splitlines()
    assert table[0] == f"synthetic-2t2s (population) in {run_dir}"
    for line in (
        "steps          12/12",
        "wall time      31 s this command; the run's steps 24 s, every session",
        "children born  2",
        "probe: base    20.0 %",
        "probe: s3@v12  35.0 % (step 12)  +15.0 points",
        "probe: s0@v12  30.0 % (step 12)  +10.0 points",
        "best - base    +15.0 points (no interval: probe.jsonl has no per-problem outcomes)",
        f"figures        populora report {run_dir}",
    ):
        assert f"  {line}" in table, line
    written = write_summary(run_dir, wall_s=31.4)
    assert json.loads((run_dir / "summary.json").read_text()) == written == summary
    # probe records written before per-problem outcomes were: the changes, without intervals
    assert summary["best_minus_base_interval"] is None and summary["probe_problems"] is None
    assert summary["student_changes"]["s0@v12"] == {
        "change": pytest.approx(0.1),
        "interval": None,
        "within_noise": None,
        "mde": None,
    }
    assert summary["per_sample"] is None and summary["best_minus_base_mde"] is None


def _outcomes(ones: int, n: int = 10, first: int = 0) -> list[int]:
    """``ones`` problems right out of ``n``, from problem ``first`` on."""
    return [int(first <= k < first + ones) for k in range(n)]


def test_paired_interval_pinned_on_hand_computed_cases():
    base = {"deduction": _outcomes(5)}
    # a student right exactly where the base is: every resampled difference is 0
    assert paired_gain_interval(dict(base), base) == (0.0, 0.0)
    # right on every problem the base missed (5 of 10): a resample gains X / 10 with X ~ Binomial(10, 1/2);
    # P(X <= 1) = 1.1 % and P(X <= 2) = 5.5 % put the 2.5 % quantile at 0.2, P(X <= 7) = 94.5 % and
    # P(X <= 8) = 98.9 % the 97.5 % one at 0.8
    assert paired_gain_interval({"deduction": [1] * 10}, base) == (0.2, 0.8)
    # the mirror image: wrong on every problem the base solved
    assert paired_gain_interval({"deduction": [0] * 10}, base) == (-0.8, -0.2)
    # as many problems won as lost: the gain is 0 and the interval straddles it
    low, high = paired_gain_interval({"deduction": _outcomes(5, first=3)}, base)
    assert low < 0 < high
    # seeded: the same outcomes give the same interval, another seed may not
    assert paired_gain_interval({"deduction": [1] * 10}, base, seed=7) == paired_gain_interval(
        {"deduction": [1] * 10}, base, seed=7
    )


def test_paired_interval_resamples_within_task_types():
    """Task type a gains on 5 of 10 problems, type b on none: a resample that kept only a's winners or none
    of them would reach 50 or 0 points; within types the gain stays X / 20, X ~ Binomial(10, 1/2)."""
    base = {"a": _outcomes(5), "b": _outcomes(5)}
    assert paired_gain_interval({"a": [1] * 10, "b": _outcomes(5)}, base) == (0.1, 0.4)
    # the count of problems weighs: a type of 30 problems counts three times a type of 10
    base = {"a": [0] * 10, "b": [0] * 30}
    low, high = paired_gain_interval({"a": [1] * 10, "b": [0] * 30}, base)
    assert low == high == 0.25


def _write_probe(run_dir: Path, base: dict[str, list[int]], students: dict[str, dict[str, list[int]]], step: int):
    records = [
        {"step": 0, "member": "base", "version": "base", "role": "base", "task_type": t, "correct": c}
        for t, c in base.items()
    ]
    records += [
        {"step": step, "member": m, "version": f"{m}@v{step}", "role": "student", "task_type": t, "correct": c}
        for m, outcomes in students.items()
        for t, c in outcomes.items()
    ]
    for r in records:
        r |= {"accuracy": sum(r["correct"]) / len(r["correct"]), "n": len(r["correct"])}
    (run_dir / "probe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_summary_gives_each_change_with_its_paired_interval(tmp_path):
    run_dir = write_run(tmp_path / "run", steps=12, children=2)
    base = {"deduction": _outcomes(5), "abduction": _outcomes(5)}
    students = {
        "s0": {"deduction": [1] * 10, "abduction": _outcomes(5)},  # right on every deduction the base missed
        "s1": dict(base),  # the base's own answers
    }
    _write_probe(run_dir, base, students, step=12)
    summary = write_summary(run_dir)
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert summary["students"] == {"s0@v12": 0.75, "s1@v12": 0.5} and summary["base_accuracy"] == 0.5
    assert summary["best"] == "s0@v12" and summary["best_minus_base"] == 0.25
    assert summary["best_minus_base_interval"] == [0.1, 0.4] and summary["best_within_noise"] is False
    # detectable change: 2.80 x the sd of the 20 per-problem differences (5 ones, 15 zeros) / sqrt(20)
    mde = min_detectable_effect((3.75 / 19) ** 0.5, 20)
    assert summary["student_changes"] == {
        "s0@v12": {"change": 0.25, "interval": [0.1, 0.4], "within_noise": False, "mde": pytest.approx(mde)},
        "s1@v12": {"change": 0.0, "interval": [0.0, 0.0], "within_noise": True, "mde": None},
    }
    assert summary["best_minus_base_mde"] == pytest.approx(mde)
    assert summary["probe_problems"] == 20 and summary["base_probe_step"] == 0
    assert summary["interval"]["level"] == 0.95 and summary["interval"]["best_selected_after_the_fact"] is True
    table = format_summary(summary).splitlines()
    for line in (
        "probe: base    50.0 %",
        "probe: s0@v12  75.0 % (step 12)  +25.0 points [+10.0, +40.0]",
        "probe: s1@v12  50.0 % (step 12)  +0.0 points [+0.0, +0.0] within noise",
        "best - base    +25.0 points [+10.0, +40.0] 95 % paired bootstrap over 20 probe problems; "
        f"detectable: {100 * mde:.1f} points",
    ):
        assert f"  {line}" in table, line

    # a best student no better than the base beyond noise says so
    students["s0"] = {"deduction": _outcomes(5, first=3), "abduction": _outcomes(6)}
    _write_probe(run_dir, base, students, step=12)
    summary = run_summary(run_dir)
    low, high = summary["best_minus_base_interval"]
    assert summary["best_minus_base"] == pytest.approx(0.05) and low < 0 < high and summary["best_within_noise"]
    assert (
        f"+5.0 points [{100 * low:+.1f}, {100 * high:+.1f}] 95 % paired bootstrap over 20 probe problems, within noise"
        in format_summary(summary)
    )


def test_summary_of_a_run_without_probe(tmp_path):
    run_dir = write_run(tmp_path / "run", steps=3)
    (run_dir / "probe.jsonl").unlink()
    summary = run_summary(run_dir)
    assert summary["students"] == {} and summary["best_minus_base"] is None and summary["wall_s"] is None
    text = format_summary(summary)
    assert "probe          not evaluated (no probe.jsonl)" in text and "best - base    -" in text


@pytest.fixture()
def env(tiny_model_dir):
    return {"POPULORA_TEST_MODEL": str(tiny_model_dir), "OMP_NUM_THREADS": "1"}


def test_populora_run_ends_with_the_summary(env, tmp_path):
    probe = tmp_path / "probe.jsonl"
    problems = ({"task_type": "count", "program": str(d), "inputs": [str(d)], "outputs": [str(d)]} for d in range(6))
    probe.write_text("".join(json.dumps(p) + "\n" for p in problems))
    run_dir = tmp_path / "run"
    args = ["steps=3", "probe.enabled=true", f"probe.file={probe}", "probe.samples=3", "--run-dir", str(run_dir)]
    result = invoke_cli("--plugin", FAKE, "run", RECIPE, *args, "--no-progress", env=env)
    assert result.returncode == 0, result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s["event"] == "step"]
    lineage = [json.loads(x) for x in (run_dir / "lineage.jsonl").read_text().splitlines()]
    assert summary["steps"] == 3 and summary["step_s"] == pytest.approx(sum(s["time/step"] for s in steps))
    assert summary["wall_s"] >= summary["step_s"] > 0
    assert summary["children_born"] == sum(r["operator"] != "init" for r in lineage) > 0
    assert len(summary["students"]) == 2 and summary["base_accuracy"] is not None
    assert summary["best_minus_base"] == pytest.approx(max(summary["students"].values()) - summary["base_accuracy"])
    # the loop's probe records carry each problem's outcome: every change comes with its paired interval
    assert summary["probe_problems"] == 6 and set(summary["student_changes"]) == set(summary["students"])
    for change in summary["student_changes"].values():
        low, high = change["interval"]
        assert low <= change["change"] <= high and change["within_noise"] == (low <= 0 <= high)
    assert summary["best_minus_base_interval"] == summary["student_changes"][summary["best"]]["interval"]
    assert "95 % paired bootstrap over 6 probe problems" in result.stdout
    # probe.samples: per-sample accuracy beside the greedy one, from each problem's count of right answers
    records = [json.loads(x) for x in (run_dir / "probe.jsonl").read_text().splitlines()]
    assert all(r["samples"] == 3 and len(r["sample_correct"]) == 6 for r in records)
    assert all(r["sample_accuracy"] == pytest.approx(sum(r["sample_correct"]) / 18) for r in records)
    sampled = summary["per_sample"]
    assert sampled["samples"] == 3 and set(sampled["students"]) == set(summary["students"])
    assert sampled["best_minus_base"] == pytest.approx(sampled["students"][sampled["best"]] - sampled["base_accuracy"])
    assert "per sample (k=3)" in result.stdout
    assert result.stdout.splitlines()[:-1] == format_summary(summary).splitlines()
    assert result.stdout.splitlines()[-1] == f"run complete: {run_dir}"


def test_a_user_error_at_the_start_exits_2_without_a_summary_or_a_run_directory(env, tmp_path):
    """A probe the recipe cannot have is found before anything is written (issue 49: failed starts leave nothing)."""
    run_dir = tmp_path / "run"
    result = run_cli("--plugin", FAKE, "run", RECIPE, "probe.enabled=true", "--run-dir", str(run_dir), env=env)
    assert result.returncode == 2
    assert "probe.enabled is true but probe.file is empty" in result.stderr and "Traceback" not in result.stderr
    assert not run_dir.exists()
    assert "populora report" not in result.stdout


def test_a_probe_that_cannot_be_drawn_is_a_recipe_error(env, tmp_path):
    """k < 1 samples, or more problems per type than the probe file holds distinct ones: exit 2, naming the key."""
    probe = tmp_path / "probe.jsonl"
    problems = [
        {"task_type": "count", "program": str(d % 4), "inputs": [str(d % 4)], "outputs": ["1"]} for d in range(6)
    ]
    probe.write_text("".join(json.dumps(p) + "\n" for p in problems))  # 4 distinct problems, two repeated
    for override, says in (("probe.samples=0", "probe.samples"), ("probe.problems_per_type=5", "4 count distinct")):
        args = ["probe.enabled=true", f"probe.file={probe}", override, "--run-dir", str(tmp_path / override)]
        result = run_cli("--plugin", FAKE, "run", RECIPE, *args, env=env)
        assert result.returncode == 2 and says in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert "probe.problems_per_type" in result.stderr or override == "probe.samples=0"


def test_summary_says_whether_selection_compared_members(tmp_path):
    run_dir = write_run(tmp_path / "run", steps=12, students={"s0": 0.3, "s1": 0.35}, base=0.2, children=0)
    records = [
        {"step": 0, "member": "s0", "role": "student", "operator": "init", "parents": []},
        {"step": 0, "member": "s1", "role": "student", "operator": "init", "parents": []},
        {"step": 4, "member": "s2", "role": "student", "replaced": "s1", "parents": ["s0@v4"], "operator": "svd"},
        {"step": 8, "member": "s3", "role": "student", "replaced": "s2", "parents": ["s0@v8"], "operator": "svd"},
        {"step": 12, "member": "s4", "role": "student", "replaced": "s0", "parents": ["s3@v4"], "operator": "svd"},
    ]
    (run_dir / "lineage.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = run_summary(run_dir)
    assert summary["selection"] == {
        "replacements_after_first": 2,
        "youngest_replaced": 1,
        "youngest_replaced_by_chance": 1.0,
        "survivor_changes": 1,
        "survivor_comparisons": 2,
    }
    line = "selection      1 of 2 replacements (after each role's first) hit its youngest member (chance 1.0); "
    assert f"  {line}survivors changed 1 of 2 times" in format_summary(summary).splitlines()
