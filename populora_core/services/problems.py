"""Problem records: JSONL files of :class:`Problem` records (probe sets, seeds, curricula).

A record is a JSON object with the problem's ``task_type``, the payload fields of that task's
:attr:`~populora_core.api.components.Task.problem_type` and, optionally, :class:`Problem`'s own fields (``valid``,
``proposer``, ...); other keys (a run's ``step``, ``metric_*``) are ignored. The task reads it
(:meth:`~populora_core.api.components.Task.load_problem`), so each task checks its own schema.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from ..api.components import Problem
from ..api.errors import UserError
from .files import atomic_write_text


def _why(exc: Exception) -> str:
    """A record's fault in one line: pydantic's field-by-field errors without their links, else the exception."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'record'}: {e['msg']}" for e in errors())
    return f"{type(exc).__name__}: {exc}"


class ProblemReader(Protocol):
    """What reads one task type's records: a :class:`~populora_core.api.components.Task` (its ``load_problem``), or
    a plugin's reader of its records where no task is built (a probe set read for a model card)."""

    def load_problem(self, record: Mapping[str, Any]) -> Problem: ...


def load_problems(path: str | Path, tasks: Mapping[str, ProblemReader]) -> list[Problem]:
    """The problems of ``tasks``' types in a JSONL file of problem records, in file order; each task reads the
    records of its type (``Task.load_problem``), records of other types are left out. A record that is not
    JSON, has no ``task_type`` or does not fit its task's schema is a :class:`UserError` naming the file, the
    line and the task."""
    file = Path(path)
    try:
        lines = file.read_text().splitlines()
    except OSError as exc:
        raise UserError(f"problem file {file}: {exc}") from None
    out = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{file}:{i}: not a Problem record ({exc})") from None
        if not isinstance(record, dict) or not isinstance(record.get("task_type"), str):
            raise UserError(f"{file}:{i}: not a Problem record (a JSON object with a task_type string)")
        task = tasks.get(record["task_type"])
        if task is None:
            continue
        try:
            problem = task.load_problem(record)
        except (ValueError, TypeError) as exc:
            raise UserError(
                f"{file}:{i}: not a Problem record of task {record['task_type']!r} "
                f"({type(task).__module__}.{type(task).__qualname__}): {_why(exc)}"
            ) from None
        out.append(problem)
    return out


def write_problems(problems: list[Problem], path: str | Path) -> Path:
    """JSONL of Problem records (what :func:`load_problems` reads), written whole or not at all."""
    out = Path(path)
    atomic_write_text(out, "".join(json.dumps(dataclasses.asdict(p), sort_keys=True) + "\n" for p in problems))
    return out


class ProblemFileEvaluator:
    """What an evaluator whose problems are one file shipped in its plugin (or a user's file instead) tells
    ``populora eval`` about its data: the file's identity, its source and a description. A subclass sets ``file``,
    ``params.path`` (the user's file, or None), ``package`` (the shipping plugin's) and the Evaluator's own
    ``name``, ``category``, ``template``, ``max_tokens`` and ``items``."""

    file: Path
    params: Any
    package: str
    name: str
    category: str
    template: str
    max_tokens: int

    def items(self, limit: int | None = None) -> list[dict[str, Any]]:
        raise NotImplementedError

    def data_files(self) -> dict[str, str]:
        return {str(self.file): hashlib.sha256(self.file.read_bytes()).hexdigest()}

    def dataset_hash(self) -> str:
        return next(iter(self.data_files().values()))

    def dataset(self) -> dict[str, Any]:
        where = (
            {"source": "file", "path": str(self.file.resolve())}
            if self.params.path
            else {"source": "shipped", "package": self.package}
        )
        return {**where, "files": {self.file.name: self.dataset_hash()}, "n_problems": len(self.items()), "skipped": 0}

    def skipped(self) -> list[str]:
        return []

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "category": self.category,
            "template": self.template,
            "max_tokens": self.max_tokens,
            "source": f"{self.dataset()['source']}: {self.file}",
            "licence": f"made here ({self.package})",
        }
