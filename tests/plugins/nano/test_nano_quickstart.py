"""A shortened quickstart: the README's main job (recipes/nano.yaml) for two steps, then its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import REPO, SHORT_GENERATIONS, run_cli, run_recipe

pytestmark = pytest.mark.slow
SHORT = [
    "steps=2",
    "evolution.every=1",
    "rollout.proposals_per_teacher=2",
    "rollout.solver_samples=2",
    "rollout.buffer_problems_per_student=1",
    "probe.problems_per_type=4",
]
# SHORT_GENERATIONS: a teacher's rated match counts whether or not its proposal is valid, so the step of the first
# child stays (nano steps=9: 54.7 -> 40.6 CPU-s, the child at step 8), and the shortened quickstart is the same path


@pytest.mark.parametrize("recipe", ["nano.yaml", "nano_single_agent.yaml"])
def test_shortened_nano_run_completes_with_probe_and_report(recipe, tmp_path):
    run_dir = tmp_path / "run"
    result = run_recipe(REPO / "recipes" / recipe, run_dir, *SHORT, *SHORT_GENERATIONS)
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


def test_a_short_nano_run_replaces_only_members_that_played_their_ready_after_matches(tmp_path):
    """Every step evolves (2T-2S: the worse member of a role mutated in place); a member is replaced only once it
    has played ready_after (default 2 x every = 2) rated matches."""
    run_dir = tmp_path / "run"
    result = run_recipe(
        REPO / "recipes" / "nano.yaml",
        run_dir,
        *SHORT[2:],
        *SHORT_GENERATIONS,
        "steps=5",
        "evolution.every=1",
        "probe.enabled=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lineage = [json.loads(x) for x in (run_dir / "lineage.jsonl").read_text().splitlines()]
    metrics = {
        s["step"]: s
        for s in (json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines())
        if s["event"] == "step"
    }
    replaced = [r for r in lineage if r.get("replaced")]
    assert replaced and {r["role"] for r in replaced} == {"teacher", "student"}
    assert min(r["step"] for r in replaced) == 2  # at step 1 nobody has played 2 matches
    for r in replaced:
        assert metrics[r["step"]][f"member/{r['replaced']}/counters/matches"] >= 2, r


def test_the_smallest_steps_the_short_run_warning_names_makes_a_child(tmp_path):
    """nano's every 4 and ready_after 8: `validate nano steps=8` says steps=9 is the smallest run with a child; a
    9-step run (rollouts shortened, which leaves each teacher's one rated match a step) makes one at step 8."""
    warned = run_cli("validate", str(REPO / "recipes" / "nano.yaml"), "steps=8")
    assert "steps=9 or more makes a child" in warned.stderr, warned.stderr
    run_dir = tmp_path / "run"
    result = run_recipe(
        REPO / "recipes" / "nano.yaml", run_dir, *SHORT[2:], *SHORT_GENERATIONS, "steps=9", "probe.enabled=false"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning: evolution" not in result.stderr
    lineage = [json.loads(x) for x in (run_dir / "lineage.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lineage if r.get("replaced")][:1] == [8]
