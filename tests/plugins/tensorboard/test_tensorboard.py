"""The TensorBoard sink: every numeric step metric is a scalar, once per step, a resumed run included."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_helpers import as_if_killed_after, invoke_cli

TESTS = Path(__file__).resolve().parents[2]
FAKE = str(TESTS / "fake_stack.py")
RECIPE = str(TESTS / "recipes" / "fake_2t2s.yaml")


def _scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_a_resumed_run_logs_each_step_once(tiny_model_dir, tmp_path):
    """Resumed from the checkpoint before the last, the run logs its last step again: TensorBoard keeps one copy
    (``purge_step``), each value the event log's."""
    run_dir = tmp_path / "run"
    env = {"POPULORA_TEST_MODEL": str(tiny_model_dir), "OMP_NUM_THREADS": "1"}
    args = ["steps=3", "sinks=[{name: tensorboard, params: {flush_secs: 1}}]", "--run-dir", str(run_dir)]
    first = invoke_cli("--plugin", FAKE, "run", RECIPE, *args, "--no-progress", env=env)
    assert first.returncode == 0, first.stderr
    assert [step for step, _ in _scalars(run_dir / "tensorboard", "solve_rate")] == [1, 2, 3]
    as_if_killed_after(run_dir, 2)  # killed inside step 3, after its log
    resumed = invoke_cli("--plugin", FAKE, "resume", str(run_dir), "--no-progress", env=env)
    assert resumed.returncode == 0, resumed.stderr
    logged = {e["step"]: e["solve_rate"] for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
              if e["event"] == "step"}  # fmt: skip
    scalars = _scalars(run_dir / "tensorboard", "solve_rate")
    assert [step for step, _ in scalars] == [1, 2, 3]
    assert all(abs(value - logged[step]) < 1e-6 for step, value in scalars)  # float32 in the event file
