"""No file of the core is over 400 lines: a file that grows past it holds two jobs, and is split by job."""

from __future__ import annotations

from pathlib import Path

import populora_core

CORE = Path(populora_core.__file__).parent
LIMIT = 400


def long_files(root: Path = CORE, limit: int = LIMIT) -> list[str]:
    """``file: N lines`` for every Python file under ``root`` longer than ``limit`` lines."""
    found = []
    for file in sorted(root.rglob("*.py")):
        lines = len(file.read_text().splitlines())
        if lines > limit:
            found.append(f"{root.name}/{file.relative_to(root).as_posix()}: {lines} lines (at most {limit})")
    return found


def test_no_core_file_is_over_400_lines():
    assert long_files() == []


def test_a_long_file_is_caught(tmp_path):
    root = tmp_path / "populora_core"
    (root / "run").mkdir(parents=True)
    (root / "run" / "loop.py").write_text("x = 1\n" * 401)
    (root / "run" / "phases.py").write_text("x = 1\n" * 400)
    assert long_files(root) == ["populora_core/run/loop.py: 401 lines (at most 400)"]
