"""A start or a resume that cannot write fails before it changes anything: exit 2 naming the path, no traceback.

Root writes through permission bits, so the tests make folders immutable (``chattr +i``), which stops root too."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli_helpers import fake_stack_manager, invoke_cli, run_in_process

TESTS = Path(__file__).resolve().parents[1]
FAKE = str(TESTS / "fake_stack.py")
RECIPE = TESTS / "recipes" / "fake_2t2s.yaml"


def _immutable(path: Path, on: bool) -> bool:
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True).returncode == 0


@pytest.fixture()
def env(tiny_model_dir):
    return {**os.environ, "POPULORA_TEST_MODEL": str(tiny_model_dir)}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_run_into_a_read_only_place_is_an_exit_2_naming_it(env, tmp_path):
    parent = tmp_path / "shared"
    parent.mkdir()
    if not _immutable(parent, True):
        pytest.skip("chattr +i is not available here (needs root on ext4/xfs)")
    try:
        result = invoke_cli(
            "--plugin", FAKE, "run", str(RECIPE), "--run-dir", str(parent / "run"), "--no-progress", env=env
        )
    finally:
        _immutable(parent, False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"--run-dir {parent / 'run'}: cannot write there" in result.stderr
    assert list(parent.iterdir()) == []


def test_a_resume_of_a_read_only_run_is_an_exit_2_naming_the_place_and_changes_nothing(env, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    monkeypatch.setenv("POPULORA_TEST_MODEL", env["POPULORA_TEST_MODEL"])
    run_in_process(fake_stack_manager(), run_dir, ["steps=2"])  # what `populora run` calls: the resume is the CLI's
    before = _files(run_dir)
    if not _immutable(run_dir / "adapters", True):
        pytest.skip("chattr +i is not available here (needs root on ext4/xfs)")
    try:
        result = invoke_cli("--plugin", FAKE, "resume", str(run_dir), "steps=3", "--no-progress", env=env)
    finally:
        _immutable(run_dir / "adapters", False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"{run_dir / 'adapters'} is not writable" in result.stderr and "chmod -R u+w" in result.stderr
    assert _files(run_dir) == before


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["probe.enabled=true", "probe.file=nope.jsonl"], "probe.file: nope.jsonl does not exist"),
        (["seeds.enabled=true", "seeds.file=seeds/none.jsonl"], "seeds.file: seeds/none.jsonl does not exist"),
        (
            ["population.init_from=runs/nowhere"],
            "population.init_from: runs/nowhere is neither a run directory nor a folder of adapters: it does not exist",
        ),
        (["probe.enabled=true", "probe.file=."], "probe.file: . is not a file"),
    ],
)
def test_validate_and_run_check_every_file_the_recipe_names_before_a_run_directory_exists(
    env, tmp_path, overrides, named
):
    """A file the recipe names that is not there: `validate` and `run` say which key and file, exit 2, and no run
    directory is left (which `resume` could not mend: the key may not change)."""
    checked = invoke_cli("--plugin", FAKE, "validate", str(RECIPE), *overrides, env=env, cwd=tmp_path)
    assert checked.returncode == 2 and named in checked.stderr and "Traceback" not in checked.stderr, checked.stderr
    assert f"override {overrides[-1]}" in checked.stderr  # the override that named it
    run_dir = tmp_path / "run"
    ran = invoke_cli(
        "--plugin",
        FAKE,
        "run",
        str(RECIPE),
        *overrides,
        "--run-dir",
        str(run_dir),
        "--no-progress",
        env=env,
        cwd=tmp_path,
    )
    assert ran.returncode == 2 and named in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    assert not run_dir.exists()


def test_an_init_from_folder_without_adapters_is_refused_by_validate_and_leaves_no_run(env, tmp_path):
    empty = tmp_path / "adapters"
    (empty / "notes").mkdir(parents=True)
    checked = invoke_cli("--plugin", FAKE, "validate", str(RECIPE), f"population.init_from={empty}", env=env)
    assert checked.returncode == 2, checked.stderr
    assert "is neither a run directory nor a folder of adapters (no members.json, no PEFT adapter folder in it)" in (
        checked.stderr
    )
    ran = invoke_cli(
        "--plugin", FAKE, "run", str(RECIPE), "--init-from", str(empty), "--run-dir", str(tmp_path / "r"), env=env
    )
    assert ran.returncode == 2 and not (tmp_path / "r").exists(), ran.stderr


def test_a_probe_file_whose_records_do_not_fit_fails_the_start_and_leaves_nothing(env, tmp_path):
    """The probe set is read when the run starts, not at its first probe: a bad one leaves no run directory."""
    probe = tmp_path / "probe.jsonl"
    probe.write_text('{"task_type": "count", "nonsense": 1}\n')
    run_dir = tmp_path / "run"
    ran = invoke_cli(
        "--plugin", FAKE, "run", str(RECIPE), "probe.enabled=true", f"probe.file={probe}", "--run-dir", str(run_dir),
        "--no-progress", env=env,
    )  # fmt: skip
    assert ran.returncode == 2 and str(probe) in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    assert not run_dir.exists()


def test_the_run_directory_is_made_and_locked_in_one_claim_and_a_refused_start_removes_nothing(tmp_path):
    """The folder is locked before anything is written into it; a second start on it is refused, and its clean-up
    (what a failed start calls) leaves the first one's run, lock included."""
    from populora_core.api.errors import UserError
    from populora_core.run.run_dir import RunDir

    target = tmp_path / "run"
    first = RunDir(target)
    first.create({"name": "x"})
    assert RunDir(target).running_pid() == os.getpid()  # locked by the create itself
    written = _files(target)
    second = RunDir(target)
    with pytest.raises(UserError, match="in use by another populora process"):
        second.create({"name": "x"})
    second.discard_new()
    assert _files(target) == written and RunDir(target).running_pid() == os.getpid()
    first.discard_new()  # the first one's own failed start: everything it made goes, the folder too
    assert not target.exists()


def test_a_failed_start_in_a_folder_the_user_made_leaves_it_as_it_was(tmp_path):
    from populora_core.run.run_dir import RunDir

    mine = tmp_path / "mine"
    mine.mkdir()
    run_dir = RunDir(mine)
    run_dir.create({"name": "x"})
    run_dir.discard_new()
    assert mine.is_dir() and list(mine.iterdir()) == []


def test_two_racing_starts_on_one_new_run_directory_one_runs_and_the_other_deletes_nothing(env, tmp_path):
    import subprocess

    from tests.cli_helpers import POPULORA, REPO

    run_dir = tmp_path / "run"
    args = [POPULORA, "--plugin", FAKE, "run", str(RECIPE), "steps=2", "--run-dir", str(run_dir), "--no-progress"]
    racers = [
        subprocess.Popen(args, env={**env, "HF_HUB_OFFLINE": "1"}, cwd=REPO, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    ended = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in racers]
    codes = sorted(code for code, _ in ended)
    assert codes == [0, 2, 2], ended
    for code, stderr in ended:
        if code == 2:
            assert "in use by another populora process" in stderr or "already holds a run" in stderr, stderr
            assert "Traceback" not in stderr
    assert (run_dir / "checkpoints" / "LATEST").read_text().strip() == "00000002"
    assert (run_dir / "recipe.yaml").is_file() and (run_dir / ".lock").is_file()
    events = [line for line in (run_dir / "events.jsonl").read_text().splitlines() if '"event": "step"' in line]
    assert len(events) == 2  # one run's steps, not two interleaved
