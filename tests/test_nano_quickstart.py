"""A shortened quickstart: the README's main job (recipes/nano.yaml) for two steps, then its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import REPO, run_cli, run_recipe

pytestmark = pytest.mark.slow
SHORT = [
    "steps=2",
    "evolution.every=1",
    "rollout.proposals_per_teacher=2",
    "rollout.solver_samples=2",
    "rollout.buffer_problems_per_student=1",
    "probe.problems_per_type=4",
]


@pytest.mark.parametrize("recipe", ["nano.yaml", "nano_single_agent.yaml"])
def test_shortened_nano_run_completes_with_probe_and_report(recipe, tmp_path):
    run_dir = tmp_path / "run"
    result = run_recipe(REPO / "recipes" / recipe, run_dir, *SHORT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 2/2" in result.stderr  # progress lines when not a TTY
    assert "Loading weights" not in result.stderr  # the libraries' own bars stay out of the run's output
    assert f"populora run {REPO / 'recipes' / recipe} -> {run_dir} (" in result.stderr  # the start-up line
    probe = [json.loads(x) for x in (run_dir / "probe.jsonl").read_text().splitlines()]
    assert {(r["step"], r["member"]) for r in probe if r["member"] == "base"} == {(0, "base")}
    assert {r["task_type"] for r in probe} == {"deduction", "abduction", "induction"}
    assert all(r["n"] == 4 for r in probe) and any(r["step"] == 2 for r in probe)
    steps = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines() if '"event": "step"' in x]
    assert [s["step"] for s in steps] == [1, 2] and all(s["validity"] is not None for s in steps)
    report = run_cli("report", str(run_dir))
    assert report.returncode == 0, report.stderr
    page = Path(report.stdout.strip().splitlines()[-1]).read_text()
    assert "Probe accuracy" in page and "Lineage" in page


def test_a_short_nano_run_replaces_a_veteran_not_only_the_newest_child(tmp_path):
    """Every step evolves: of the replacements after each role's first, some hit a member older than the newest
    child (with children on the rating prior, mu - 3 sigma put the newest child last every time)."""
    from populora_core.population import selection_history

    run_dir = tmp_path / "run"
    result = run_recipe(
        REPO / "recipes" / "nano.yaml", run_dir, *SHORT[2:], "steps=5", "evolution.every=1", "probe.enabled=false"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lineage = [json.loads(x) for x in (run_dir / "lineage.jsonl").read_text().splitlines()]
    history = selection_history(lineage)
    assert history["replacements_after_first"] == 6
    assert history["youngest_replaced"] < 6, history
    assert history["survivor_changes"] >= 1, history
