"""The end of a run: the summary table from a recorded run, and what `populora run` prints and writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from populora_report.summary import format_summary, run_summary, write_summary

from tests.cli_helpers import run_cli
from tests.synthetic_runs import write_run

TESTS = Path(__file__).parent
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
        "wall time      31 s (steps 24 s)",
        "children born  2",
        "probe: base    20.0 %",
        "probe: s3@v12  35.0 % (step 12)",
        "probe: s0@v12  30.0 % (step 12)",
        "best - base    +15.0 points",
        f"figures        populora report {run_dir}",
    ):
        assert f"  {line}" in table, line
    written = write_summary(run_dir, wall_s=31.4)
    assert json.loads((run_dir / "summary.json").read_text()) == written == summary


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
    args = ["steps=3", "probe.enabled=true", f"probe.file={probe}", "--run-dir", str(run_dir), "--no-progress"]
    result = run_cli("--plugin", FAKE, "run", RECIPE, *args, env=env)
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
    assert result.stdout.splitlines()[:-1] == format_summary(summary).splitlines()
    assert result.stdout.splitlines()[-1] == f"run complete: {run_dir}"


def test_a_user_error_mid_run_exits_2_without_a_summary(env, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli("--plugin", FAKE, "run", RECIPE, "probe.enabled=true", "--run-dir", str(run_dir), env=env)
    assert result.returncode == 2
    assert "probe.enabled is true but probe.file is empty" in result.stderr and "Traceback" not in result.stderr
    assert (run_dir / "recipe.yaml").is_file() and not (run_dir / "summary.json").exists()
    assert "populora report" not in result.stdout
