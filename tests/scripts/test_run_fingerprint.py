"""scripts/run_fingerprint.py: what a refactoring must leave bit-identical, compared between two run folders."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "run_fingerprint.py"


def _run(*args: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_equal_runs_pass_and_a_changed_weight_or_probe_is_named(tmp_path):
    a = tmp_path / "a"
    (a / "adapters" / "s0@v1").mkdir(parents=True)
    (a / "adapters" / "s0@v1" / "adapter_model.safetensors").write_bytes(b"weights")
    (a / "probe.jsonl").write_text('{"accuracy": 0.5}\n')
    (a / "run.log").write_text("wall times differ between runs\n")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    (b / "run.log").write_text("another time\n")
    same = _run(a, b)
    assert same.returncode == 0 and "2 files identical, 0 not" in same.stdout
    (b / "adapters" / "s0@v1" / "adapter_model.safetensors").write_bytes(b"weightz")
    (b / "probe.jsonl").unlink()
    changed = _run(a, b)
    assert changed.returncode == 1
    assert "differs: adapters/s0@v1/adapter_model.safetensors" in changed.stdout
    assert "only in one run: probe.jsonl" in changed.stdout


def test_a_folder_without_results_is_an_error(tmp_path):
    result = _run(tmp_path)
    assert result.returncode != 0 and "no run results here" in result.stderr
