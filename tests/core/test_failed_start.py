"""A start or a resume that cannot write fails before it changes anything: exit 2 naming the path, no traceback.

Root writes through permission bits, so the tests make folders immutable (``chattr +i``), which stops root too."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli

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
        result = run_cli(
            "--plugin", FAKE, "run", str(RECIPE), "--run-dir", str(parent / "run"), "--no-progress", env=env
        )
    finally:
        _immutable(parent, False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"--run-dir {parent / 'run'}: cannot write there" in result.stderr
    assert list(parent.iterdir()) == []


def test_a_resume_of_a_read_only_run_is_an_exit_2_naming_the_place_and_changes_nothing(env, tmp_path):
    run_dir = tmp_path / "run"
    ran = run_cli("--plugin", FAKE, "run", str(RECIPE), "steps=2", "--run-dir", str(run_dir), "--no-progress", env=env)
    assert ran.returncode == 0, ran.stderr
    before = _files(run_dir)
    if not _immutable(run_dir / "adapters", True):
        pytest.skip("chattr +i is not available here (needs root on ext4/xfs)")
    try:
        result = run_cli("--plugin", FAKE, "resume", str(run_dir), "steps=3", "--no-progress", env=env)
    finally:
        _immutable(run_dir / "adapters", False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"{run_dir / 'adapters'} is not writable" in result.stderr and "chmod -R u+w" in result.stderr
    assert _files(run_dir) == before
