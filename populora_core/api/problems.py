"""Problem records: JSONL files of :class:`Problem` (probe sets, seeds, curricula)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .components import Problem
from .errors import UserError
from .files import atomic_write_text


def load_problems(path: str | Path) -> list[Problem]:
    """Problems from a JSONL file of Problem records (a probe set, a curriculum); file:line in every error."""
    file = Path(path)
    try:
        lines = file.read_text().splitlines()
    except OSError as exc:
        raise UserError(f"problem file {file}: {exc}") from None
    names = {f.name for f in dataclasses.fields(Problem)}
    out = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            problem = Problem(**{k: v for k, v in record.items() if k in names})
        except (json.JSONDecodeError, TypeError, AttributeError) as exc:
            raise UserError(f"{file}:{i}: not a Problem record ({exc})") from None
        if not problem.inputs or len(problem.inputs) != len(problem.outputs):
            raise UserError(f"{file}:{i}: a problem needs as many outputs as inputs, at least one")
        out.append(problem)
    return out


def write_problems(problems: list[Problem], path: str | Path) -> Path:
    """JSONL of Problem records (what :func:`load_problems` reads), written whole or not at all."""
    out = Path(path)
    atomic_write_text(out, "".join(json.dumps(dataclasses.asdict(p), sort_keys=True) + "\n" for p in problems))
    return out
