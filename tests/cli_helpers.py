"""Helpers for tests that run the real ``populora`` console script in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POPULORA = shutil.which("populora", path=str(Path(sys.executable).parent)) or "populora"


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        [POPULORA, *args], capture_output=True, text=True, env=full_env, cwd=cwd or REPO, timeout=timeout
    )


def pip_install_target(package_dir: Path, target: Path) -> None:
    """Install a plugin package into ``target`` (put on PYTHONPATH): a real entry point, no venv pollution."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(package_dir),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
