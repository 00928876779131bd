"""The runs under a folder and where each stands: what ``populora runs`` shows."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from .checkpoints import find_resume_point
from .run_dir import RunDir


def list_runs(root: str | os.PathLike[str], depth: int = 3) -> list[dict[str, Any]]:
    """Every run directory under ``root`` (``recipe.yaml`` up to ``depth`` levels down): what ``populora runs``
    shows. ``status``: running (another process holds its lock), finished, stopped (``populora resume`` goes on),
    unreadable (its recipe.yaml does not parse), damaged (a checkpoint is damaged: from which step a resume goes
    on, or that none can)."""
    found: list[dict[str, Any]] = []
    base = Path(root)
    for recipe_file in sorted(base.glob("recipe.yaml")) + sorted(
        p for level in range(1, depth + 1) for p in base.glob("/".join(["*"] * level) + "/recipe.yaml")
    ):
        run_dir = RunDir(recipe_file.parent)
        try:
            recipe = yaml.safe_load(recipe_file.read_text()) or {}
            problem = None if isinstance(recipe, dict) else "recipe.yaml: not a mapping"
        except (OSError, yaml.YAMLError) as exc:  # listed, not hidden: the user may have edited it by hand
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            why = getattr(exc, "problem", None) or getattr(exc, "strerror", None) or type(exc).__name__
            problem = f"recipe.yaml{where}: {why}"
        if problem is not None:
            found.append(
                {
                    "path": str(run_dir.path),
                    "recipe": "?",
                    **dict.fromkeys(("seed", "steps_done", "steps", "best_minus_base"), None),
                    "best_minus_base_interval": None,
                    "status": f"unreadable: {problem} (fix it, or remove the run)",
                }
            )
            continue
        planned = int(recipe.get("steps", 0) or 0)
        point = find_resume_point(run_dir.path, hashes=False)
        done = point.step
        pid = run_dir.running_pid()
        if pid is not None:
            status = f"running (pid {pid})"
        elif point.damaged:
            status = f"damaged (resumes from step {done})" if point.checkpoint else "damaged (no intact checkpoint)"
        else:
            status = "finished" if planned and done >= planned else "stopped"
        summary: dict[str, Any] = {}
        if (run_dir.path / "summary.json").is_file():
            try:
                summary = json.loads((run_dir.path / "summary.json").read_text())
            except (OSError, json.JSONDecodeError):
                summary = {}
        found.append(
            {
                "path": str(run_dir.path),
                "recipe": recipe.get("name", "?"),
                "seed": recipe.get("seed"),
                "steps_done": done,
                "steps": planned,
                "status": status,
                "best_minus_base": summary.get("best_minus_base"),
                "best_minus_base_interval": summary.get("best_minus_base_interval"),
            }
        )
    return found
