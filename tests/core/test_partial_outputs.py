"""Full disks and killed writers: a checkpoint that does not fit is one clear error naming the path and the bytes it
needs, with the previous checkpoint intact; an export killed mid-write leaves no hidden copy for good.

The disk is a real small tmpfs (``mount -t tmpfs``, which needs root): skipped where it cannot be mounted."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from populora_core.api.errors import UserError
from populora_core.run.run_dir import RunDir
from tests.cli_helpers import POPULORA, REPO, invoke_cli, run_cli

TESTS = Path(__file__).resolve().parents[1]
FAKE = str(TESTS / "fake_stack.py")
RECIPE = TESTS / "recipes" / "fake_2t2s.yaml"


@pytest.fixture()
def small_disk(tmp_path):
    """A 4 MiB file system of its own."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` until ``leave`` bytes are free."""
    import shutil

    free = shutil.disk_usage(disk).free
    with open(disk / "filler", "ab") as fh:
        fh.write(b"\0" * max(0, free - leave))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _save_big(directory: Path) -> None:
    import torch

    torch.save(torch.zeros(300_000), directory / "optimizer.pt")  # 1.2 MB, as a trainer's moments


def test_a_disk_that_fills_during_a_checkpoint_is_one_error_naming_path_and_bytes_and_keeps_the_previous(small_disk):
    run = RunDir(small_disk / "run")
    run.create({"name": "x"})
    first = run.write_checkpoint(1, {"population": {"members": []}})
    _fill(small_disk, 200_000)
    with pytest.raises(UserError) as err:  # torch.save's own error names no errno: "enforce fail at inline_container"
        run.write_checkpoint(2, {"population": {"members": []}}, {"trainer": _save_big})
    said = str(err.value)
    assert said.startswith(f"no space left for the checkpoint of step 2 in {run.checkpoints}: it needs about ")
    assert "ran out of space while writing it" in said and "the checkpoint of step 1 is intact" in said
    assert f"`populora resume {run.path}`" in said
    assert int(said.split("needs about ")[1].split(" bytes")[0].replace(",", "")) > 150_000  # what it had written
    assert run.latest_checkpoint() == first and run.read_checkpoint(first)["step"] == 1
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["00000001", "LATEST"]  # no half-written one


def test_a_checkpoint_the_disk_cannot_hold_is_refused_before_any_of_it_is_written(small_disk):
    run = RunDir(small_disk / "run")
    run.create({"name": "x"})
    run.write_checkpoint(1, {"population": {"members": []}}, {"trainer": _save_big})
    _fill(small_disk, 500_000)
    before = _files(run.path)
    with pytest.raises(UserError, match=r"it needs about 1,2\d\d,\d\d\d bytes and the disk does not have it free"):
        run.write_checkpoint(2, {"population": {"members": []}}, {"trainer": _save_big})
    assert _files(run.path) == before


def test_resume_on_a_full_disk_says_so_before_it_redoes_a_step(small_disk, tiny_model_dir):
    env = {**os.environ, "POPULORA_TEST_MODEL": str(tiny_model_dir)}
    run_dir = small_disk / "run"
    ran = invoke_cli(
        "--plugin", FAKE, "run", str(RECIPE), "steps=2", "--run-dir", str(run_dir), "--no-progress", env=env
    )
    assert ran.returncode == 0, ran.stderr
    _fill(small_disk, 1_000)
    before = _files(run_dir)
    resumed = invoke_cli("--plugin", FAKE, "resume", str(run_dir), "steps=4", "--no-progress", env=env)
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr, resumed.stderr
    assert f"no space left for the next checkpoint in {run_dir / 'checkpoints'}: it needs about " in resumed.stderr
    assert "the checkpoint of step 2 is intact" in resumed.stderr
    assert _files(run_dir) == before


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_dir):
    run_dir = tmp_path_factory.mktemp("export") / "run"
    env = {**os.environ, "POPULORA_TEST_MODEL": str(tiny_model_dir)}
    ran = invoke_cli(
        "--plugin", FAKE, "run", str(RECIPE), "steps=1", "--run-dir", str(run_dir), "--no-progress", env=env
    )
    assert ran.returncode == 0, ran.stderr
    return run_dir, env


def test_the_next_export_removes_what_a_killed_export_left_and_says_so(finished, tmp_path):
    run_dir, env = finished
    out = tmp_path / "merged"
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid no process has now
    left = tmp_path / f".merged.{dead.pid}-0123abcd"
    (left / "model.safetensors").parent.mkdir()
    (left / "model.safetensors").write_bytes(b"\0" * 5000)
    live = tmp_path / f".merged.{os.getpid()}-89abcdef"  # a live process's write in progress: not touched
    live.mkdir()
    done = run_cli("--plugin", FAKE, "export", str(run_dir), "s0", "--out", str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert f"removed {left} (5,000 bytes), left by an export of {out} that was killed mid-write" in done.stderr
    assert not left.exists() and live.is_dir() and (out / "adapter_config.json").is_file()


def test_a_sigterm_during_export_merge_leaves_no_hidden_folder(finished, tmp_path):
    run_dir, env = finished
    out = tmp_path / "merged"
    proc = subprocess.Popen(
        [POPULORA, "--plugin", FAKE, "export", str(run_dir), "s0", "--out", str(out), "--merge"],
        env={**env, "HF_HUB_OFFLINE": "1"},
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".merged.*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(tmp_path.glob(".merged.*")), "the export never began its write"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its hidden copy
