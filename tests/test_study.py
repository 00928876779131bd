"""The study's summary of a recorded run: the best student's gain over the base and its paired interval."""

from __future__ import annotations

import json

import pytest

from benchmarks.study import paired_gain_interval, summarize


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
