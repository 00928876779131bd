"""What is installed, read without importing it: a distribution's version, torch's CUDA version (from
``torch/version.py`` as text), and whether the GPU vLLM is in the range the vllm engine was checked against.

``populora doctor`` (:mod:`populora_core.cli.doctor`) reports on all of it; the runtime's allocator default and the
start of the vllm engine read it too.
"""

from __future__ import annotations

import re
from pathlib import Path

# The vLLM range the GPU path was read and checked against; pyproject's `vllm` extra pins the same (a test checks).
CHECKED_VLLM = ">=0.32,<0.35"

GPU_INSTALL = 'pip install -e ".[vllm]"'

# Oldest Linux driver branch each CUDA major version of a torch wheel runs on (minor-version compatibility). vLLM
# 0.34's wheels are CUDA 13 builds (torch 2.14): R580+.
MIN_DRIVER = {11: 450, 12: 525, 13: 580}


def version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def torch_cuda_version() -> str | None:
    """torch's CUDA version from ``torch/version.py`` as text (importing torch takes seconds)."""
    from importlib import metadata

    try:
        path = metadata.distribution("torch").locate_file("torch/version.py")
        text = Path(str(path)).read_text(encoding="utf-8")
    except (metadata.PackageNotFoundError, OSError):
        return None
    return cuda_from_version_py(text)


def cuda_from_version_py(text: str) -> str | None:
    """``cuda = '13.0'`` -> "13.0"; a ROCm build (``hip = '6.4...'``) -> "ROCm 6.4..."; a CPU build -> None."""
    for key, prefix in (("cuda", ""), ("hip", "ROCm ")):
        match = re.search(rf"^{key}\b[^=]*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        if match:
            return prefix + match.group(1)
    return None


def unchecked_vllm(installed: str | None) -> str | None:
    """A warning when the installed GPU ``vllm`` is outside the range its calls were read against
    (tests/plugins/engines/test_vllm_api.py lists them; pyproject's ``vllm`` extra pins the same), else None. ``populora
    doctor`` and the start of anything that builds the vllm engine say it: it may work, or fail on a changed call."""
    if not installed:
        return None
    from packaging.specifiers import SpecifierSet

    if SpecifierSet(CHECKED_VLLM).contains(installed, prereleases=True):
        return None
    return (
        f"vllm {installed} is outside the range this code was checked against ({CHECKED_VLLM}, pyproject's vllm "
        f"extra): the vllm engine may fail on a changed call; {GPU_INSTALL} installs a checked one"
    )


def nvidia_gpus() -> tuple[str | None, int]:
    """(the driver version, how many GPUs ``nvidia-smi`` lists); (None, 0) without a working nvidia-smi. Asks
    neither torch nor CUDA, so it is safe before anything decides how to start CUDA."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, 0
    query = [exe, "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None, 0
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return (lines[0] if lines else None), len(lines)
