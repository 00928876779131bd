"""A plain (non-editable) install runs what the package ships: the wheel, installed into a fresh virtual environment
that sees the test venv's dependencies but not the source tree, runs shipped recipes by name from an empty folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: What a wheel build reads: the packages and the readme (tests, benchmarks and runs stay behind).
SOURCES = ("pyproject.toml", "README.md", "populora_core", "plugins", "scripts", "recipes")
SKIP = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "runs", "report", ".pytest_cache")


def _copy_source(dest: Path) -> Path:
    dest.mkdir()
    for name in SOURCES:
        src = REPO / name
        if src.is_symlink():  # recipes -> populora_core/recipes, as git checks it out
            (dest / name).symlink_to(os.readlink(src))
        elif src.is_dir():
            shutil.copytree(src, dest / name, ignore=SKIP)
        else:
            shutil.copy2(src, dest / name)
    return dest


def _dependencies_view(dest: Path) -> Path:
    """The test venv's site-packages without this project (its editable hook and metadata): a folder of links."""
    site = Path(sysconfig.get_paths()["purelib"])
    dest.mkdir()
    for entry in site.iterdir():
        name = entry.name.lower()
        if name.startswith(("populora_toolkit", "__editable__", "populora_core", "populora-toolkit")):
            continue
        (dest / entry.name).symlink_to(entry)
    return dest


@pytest.mark.slow
def test_the_wheel_installed_without_the_source_tree_runs_shipped_recipes_by_name(tmp_path):
    source = _copy_source(tmp_path / "src")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), "."],
        capture_output=True,
        text=True,
        cwd=source,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    output = built.stdout + built.stderr
    assert "deprecat" not in output.lower() and "BuildBackendWarning" not in output, output  # project.license: SPDX
    assert not (source / "build").exists()  # the build leaves no build/ folder behind
    (wheel,) = (tmp_path / "dist").glob("populora_toolkit-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "test_dependencies.pth").write_text(f"{_dependencies_view(tmp_path / 'deps')}\n")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr

    empty = tmp_path / "elsewhere"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    populora = str(venv / "bin" / "populora")

    def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([populora, *args], capture_output=True, text=True, cwd=empty, env=env, timeout=timeout)

    where = subprocess.run(
        [str(python), "-c", "import populora_core as c, populora_nano as n; print(c.__file__, n.__file__)"],
        capture_output=True,
        text=True,
        cwd=empty,
        env=env,
    )
    assert where.returncode == 0, where.stderr
    assert all(Path(p).is_relative_to(venv) for p in where.stdout.split()), where.stdout  # the wheel, not the clone

    listed = cli("recipes")
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert "nano" in names and "azr_7b" in names and "azr_llama3.1_8b" in names
    shown = cli("recipes", "show", "nano")
    assert shown.returncode == 0 and "base_model: nano" in shown.stdout

    assert cli("validate", "nano").returncode == 0
    dry = cli("run", "nano", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "name: nano" in dry.stdout and not (empty / "runs").exists()
    seven = cli("run", "azr_7b", "--dry-run")
    assert seven.returncode == 0, seven.stderr
    planned = cli("plan", "azr_7b", "--gpu-memory", "80GiB")  # Qwen2.5-7B's config ships: planned offline
    assert planned.returncode == 0 and "fits: peak" in planned.stdout, planned.stdout + planned.stderr
    copied = cli("recipes", "copy", "azr_llama3.1_8b", "mine.yaml")  # an editable copy plans offline too (gated hub)
    assert copied.returncode == 0 and (empty / "mine.yaml").is_file(), copied.stderr
    assert cli("plan", "mine.yaml", "--gpu-memory", "80GiB").returncode == 0

    typo = cli("run", "nanoo", "--dry-run")
    assert typo.returncode == 2 and "did you mean nano?" in typo.stderr and "azr_7b" in typo.stderr
    assert "Traceback" not in typo.stderr

    ran = cli("run", "nano", "steps=1", "probe.enabled=false", "--no-progress", timeout=600)
    assert ran.returncode == 0, ran.stderr
    summary = json.loads((empty / "runs" / "nano" / "summary.json").read_text())
    assert summary["steps"] == 1
    assert (empty / "runs" / "nano" / "adapters").is_dir()
