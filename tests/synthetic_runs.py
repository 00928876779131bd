"""Run directories written from known numbers (no training): the logs a finished run leaves behind."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import yaml


def _jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def write_run(
    run_dir: Path,
    *,
    name: str = "synthetic-2t2s",
    mode: str = "population",
    seed: int = 0,
    steps: int = 60,
    depth_slope: float = 0.0,
    swing: float = 0.0,
    students: dict[str, float] | None = None,
    base: float = 0.2,
    children: int = 0,
    step_s: float = 2.0,
    levels: int = 0,
) -> Path:
    """A finished run: a sine of amplitude ``swing`` (period 20) in the solve rate, AST depth rising by
    ``depth_slope`` a step, two new signatures a step, final probe accuracies ``students`` (member -> acc).

    ``levels``: its task declares levels 1..levels, so each step logs the difficulty metrics: teacher k's mean
    difficulty rising by (k + 1) / steps a step from 1, each student's solve rate at level L falling with L (none
    at the top level on odd steps). Teachers are t0 and t1 (in a single-agent run, the students' ids)."""
    rng = random.Random(seed)
    students = {"s0": 0.3, "s1": 0.25} if students is None else students
    recipe = {"name": name, "seed": seed, "steps": steps, "population": {"mode": mode}}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    events, problems = [], []
    for step in range(1, steps + 1):
        rate = 0.4 + swing * math.sin(2 * math.pi * step / 20) + rng.gauss(0, 0.02)
        events.append({"event": "step", "step": step, "solve_rate": rate, "validity": 0.8, "time/step": step_s})
        if levels:
            teachers = list(students) if mode == "single_agent" else ["t0", "t1"]
            taught = {f"member/{t}/difficulty": 1 + (k + 1) * step / steps for k, t in enumerate(teachers)}
            events[-1] |= taught | {"teacher/difficulty": sum(taught.values()) / len(taught)}
            events[-1] |= {f"member/{t}/validity": 0.8 for t in teachers}
            for i, member in enumerate(students):
                events[-1][f"member/{member}/solve_rate"] = rate
                for lv in range(1, levels + 1):
                    solved = None if lv == levels and step % 2 else max(0.0, 1 - lv / (levels + 1) - 0.1 * i)
                    events[-1][f"member/{member}/solve_rate_at_level/{lv}"] = solved
        for k in range(4):
            depth = 3 + depth_slope * step + rng.gauss(0, 0.3)
            signature = f"{step}-{k}" if k < 2 else "common"
            problems.append(
                {"step": step, "valid": True, "signature": signature, "metric_ast_depth": depth}
                | {"metric_cyclomatic": 2.0, "metric_loc": 5.0}
            )
    probe = [{"step": 0, "member": "base", "version": "base", "role": "base", "task_type": "deduction"}]
    probe[0] |= {"accuracy": base, "n": 10}
    role = "both" if mode == "single_agent" else "student"
    for member, acc in students.items():
        version = {"member": member, "version": f"{member}@v{steps}", "role": role}
        probe.append({"step": steps, **version, "task_type": "deduction", "accuracy": acc, "n": 10})
    lineage = [{"step": 0, "member": m, "operator": "init", "parents": []} for m in students]
    lineage += [
        {"step": 4 * (i + 1), "member": f"c{i}", "operator": "svd", "parents": ["s0@v1"], "replaced": "s1"}
        for i in range(children)
    ]
    _jsonl(run_dir / "events.jsonl", events)
    _jsonl(run_dir / "tasks" / "problems.jsonl", problems)
    _jsonl(run_dir / "probe.jsonl", probe)
    _jsonl(run_dir / "lineage.jsonl", lineage)
    return run_dir
