"""A new user's common mistakes at the command line: each is exit 2 (or the stop it is), one line naming the problem
and the way out, no traceback, nothing of the user's deleted."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.cli_helpers import kill_inside_step, run_cli

TESTS = Path(__file__).resolve().parents[1]
FAKE = str(TESTS / "fake_stack.py")
RECIPE = TESTS / "recipes" / "fake_2t2s.yaml"


def _one_line_error(result, *says: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.stderr, result.stderr
    for text in says:
        assert text in lines[0], lines[0]


def test_an_option_named_like_a_recipe_key_is_answered_with_the_override_to_write(tmp_path):
    """`--steps 2` (click: "Did you mean '--help'?") gets the override that does it, for each command taking them."""
    run_dir = tmp_path / "run"
    _one_line_error(
        run_cli("run", str(RECIPE), "--steps", "2", "--run-dir", str(run_dir)),
        "populora run has no option --steps",
        "write `steps=2`",
    )
    _one_line_error(run_cli("resume", str(run_dir), "--steps=8"), "write `steps=8` (populora resume RUN_DIR steps=8)")
    _one_line_error(run_cli("validate", str(RECIPE), "--trainer.params.lr", "0.1"), "write `trainer.params.lr=0.1`")
    assert not run_dir.exists()
    other = run_cli("run", str(RECIPE), "--stepz", "2")  # not a recipe key: click's own answer stays
    assert other.returncode == 2 and "No such option" in other.stderr


def test_runs_lists_a_run_whose_recipe_does_not_parse_as_unreadable_with_the_reason(tmp_path):
    broken = tmp_path / "runs" / "edited"
    broken.mkdir(parents=True)
    (broken / "recipe.yaml").write_text("name: x\nsteps: [1,\n")
    table = run_cli("runs", str(tmp_path / "runs"))
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith(str(broken)))
    assert "unreadable: recipe.yaml line 3:" in row and "fix it, or remove the run" in row
    (entry,) = json.loads(run_cli("runs", str(tmp_path / "runs"), "--json").stdout)
    assert entry["status"].startswith("unreadable: recipe.yaml line 3") and entry["steps"] is None
    assert (broken / "recipe.yaml").read_text() == "name: x\nsteps: [1,\n"
    (broken / "recipe.yaml").write_text("- a list\n")  # parses, but is no recipe
    (entry,) = json.loads(run_cli("runs", str(tmp_path / "runs"), "--json").stdout)
    assert entry["status"] == "unreadable: recipe.yaml: not a mapping (fix it, or remove the run)"


def test_an_unknown_benchmark_gets_the_nearest_name():
    _one_line_error(
        run_cli("eval", "nano", "--benchmarks", "humaneval_pluss", "--no-base"),
        "unknown benchmark 'humaneval_pluss'",
        "did you mean 'humaneval_plus'?",
    )
    _one_line_error(run_cli("eval", "nano", "--benchmarks", "mbpp:x"), "after ':' comes how many problems")


@pytest.fixture()
def env(tiny_model_dir):
    return {**os.environ, "POPULORA_TEST_MODEL": str(tiny_model_dir), "HF_HUB_OFFLINE": "1"}


def test_ctrl_c_before_the_first_checkpoint_promises_no_checkpoint(env, tmp_path):
    """Stopped inside step 1 (nothing checkpointed): the message says resume starts over, not that it continues."""
    run_dir = tmp_path / "early"
    args = ["--plugin", FAKE, "run", str(RECIPE), "--no-progress", "--run-dir", str(run_dir)]
    code, stderr = kill_inside_step(args, env, 1, tmp_path / "paused", sig=signal.SIGINT)
    assert code == 130 and "Traceback" not in stderr, stderr
    said = f"interrupted after step 0, before the first checkpoint: nothing to continue from; `populora resume {run_dir}` starts the run over"  # noqa: E501
    assert said in stderr and "continues from its last checkpoint" not in stderr
    assert said in (run_dir / "run.log").read_text()
