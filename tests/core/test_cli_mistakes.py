"""A new user's common mistakes at the command line: each is exit 2 (or the stop it is), one line naming the problem
and the way out, no traceback, nothing of the user's deleted."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.cli_helpers import invoke_cli, kill_inside_step

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
        invoke_cli("run", str(RECIPE), "--steps", "2", "--run-dir", str(run_dir)),
        "populora run has no option --steps",
        "write `steps=2`",
    )
    _one_line_error(
        invoke_cli("resume", str(run_dir), "--steps=8"), "write `steps=8` (populora resume RUN_DIR steps=8)"
    )
    _one_line_error(invoke_cli("validate", str(RECIPE), "--trainer.params.lr", "0.1"), "write `trainer.params.lr=0.1`")
    assert not run_dir.exists()
    other = invoke_cli("run", str(RECIPE), "--stepz", "2")  # not a recipe key: click's own answer stays
    assert other.returncode == 2 and "No such option" in other.stderr


def test_runs_lists_a_run_whose_recipe_does_not_parse_as_unreadable_with_the_reason(tmp_path):
    broken = tmp_path / "runs" / "edited"
    broken.mkdir(parents=True)
    (broken / "recipe.yaml").write_text("name: x\nsteps: [1,\n")
    table = invoke_cli("runs", str(tmp_path / "runs"))
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith(str(broken)))
    assert "unreadable: recipe.yaml line 3:" in row and "fix it, or remove the run" in row
    (entry,) = json.loads(invoke_cli("runs", str(tmp_path / "runs"), "--json").stdout)
    assert entry["status"].startswith("unreadable: recipe.yaml line 3") and entry["steps"] is None
    assert (broken / "recipe.yaml").read_text() == "name: x\nsteps: [1,\n"
    (broken / "recipe.yaml").write_text("- a list\n")  # parses, but is no recipe
    (entry,) = json.loads(invoke_cli("runs", str(tmp_path / "runs"), "--json").stdout)
    assert entry["status"] == "unreadable: recipe.yaml: not a mapping (fix it, or remove the run)"


def test_an_unknown_benchmark_gets_the_nearest_name():
    _one_line_error(
        invoke_cli("eval", "nano", "--benchmarks", "humaneval_pluss", "--no-base"),
        "unknown benchmark 'humaneval_pluss'",
        "did you mean 'humaneval_plus'?",
    )
    _one_line_error(invoke_cli("eval", "nano", "--benchmarks", "mbpp:x"), "after ':' comes how many problems")


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


def test_help_names_damaged_runs_resume_options_and_shows_no_rst_markup():
    """`runs --help` names every status `populora runs` shows (damaged too); `resume` and `validate` help is plain
    text (no RST double backticks); `resume --help` writes cluster overrides as the README does (`cluster=ray`) and
    explains --progress."""
    runs = invoke_cli("runs", "--help").stdout
    assert "damaged" in runs and "RUN/damaged/" in runs
    for command in ("resume", "validate", "run", "runs", "recipes"):
        shown = invoke_cli(command, "--help")
        assert shown.returncode == 0 and "``" not in shown.stdout, (command, shown.stdout)
    resume = invoke_cli("resume", "--help").stdout
    assert "cluster=ray cluster.params.workers=4" in resume and "cluster.name=" not in resume
    assert "cluster=ray cluster.params.workers=4" in (TESTS.parent / "README.md").read_text()
    progress = next(line for line in resume.splitlines() if "--progress" in line)
    assert "Live display" in progress


def test_the_side_by_side_reports_default_folder_is_ignored_by_git():
    """`populora report A B` writes ./report/ by default: a clone's `git status` stays clean of it."""
    import shutil
    import subprocess

    repo = TESTS.parent
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", "report/report.html"], cwd=repo, timeout=60)
    assert ignored.returncode == 0
    kept = subprocess.run(["git", "check-ignore", "-q", "plugins/populora_report/render.py"], cwd=repo, timeout=60)
    assert kept.returncode == 1  # only the top-level folder: the plugin's own sources stay tracked


def test_a_run_into_a_finished_run_suggests_extending_it_or_a_new_run_dir(tmp_path, tiny_model_dir):
    """`populora run` into a finished run: `resume` would do nothing, so the error offers `resume ... steps=N` and
    another --run-dir; into a stopped run it still offers `resume`."""
    env = {"POPULORA_TEST_MODEL": str(tiny_model_dir)}
    run_dir = tmp_path / "run"
    first = invoke_cli(
        "--plugin", FAKE, "run", str(RECIPE), "steps=1", "--run-dir", str(run_dir), "--no-progress", env=env
    )
    assert first.returncode == 0, first.stderr
    again = invoke_cli("--plugin", FAKE, "run", str(RECIPE), "steps=1", "--run-dir", str(run_dir), env=env)
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr
    error = again.stderr.strip().splitlines()[-1]  # after the start-up line
    assert error.startswith(f"Error: run directory {run_dir} holds a finished run (1 of 1 steps)"), error
    assert f"`populora resume {run_dir} steps=2` extends it" in error and "choose another --run-dir" in error
    assert f"`populora resume {run_dir}` " not in again.stderr  # a plain resume has nothing to do
    recipe = run_dir / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("steps: 1\n", "steps: 3\n"))  # as a stopped 3-step run leaves it
    stopped = invoke_cli("--plugin", FAKE, "run", str(RECIPE), "--run-dir", str(run_dir), env=env)
    assert stopped.returncode == 2 and "Traceback" not in stopped.stderr, stopped.stderr
    assert "already holds a run (1 of 3 steps checkpointed)" in stopped.stderr
    assert f"`populora resume {run_dir}` continues it" in stopped.stderr
