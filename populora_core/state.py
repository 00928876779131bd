"""A run's state: the seed buffers it starts from, and the atomic checkpoints it resumes from."""

from __future__ import annotations

import pickle
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UserError
from .population import Population
from .problems import load_problems

if TYPE_CHECKING:
    from .loop import Run


def seed_buffers(run: Run) -> None:
    """Fill each task's buffer with the seed problems of its type (recipe ``seeds``), before step 1."""
    cfg = run.recipe.seeds
    if not cfg.enabled:
        return
    problems = load_problems(cfg.file)
    counts = {}
    for name, task in run.tasks.items():
        own = [p for p in problems if p.task_type == name and p.valid]
        task.add_to_buffer(own)
        counts[name] = len(own)
    if not any(counts.values()):
        kinds = ", ".join(run.tasks)
        raise UserError(f"seeds file {cfg.file}: no valid problem of the recipe's task types ({kinds})")
    run.emit([{"event": "seeds", "step": 0, "file": cfg.file, **{f"seeds/{k}": v for k, v in counts.items()}}])


def restore(run: Run) -> None:
    """Roll the run directory and every component back to the latest complete checkpoint."""
    path = run.dir.latest_checkpoint()
    assert path is not None, "resume_run starts over a run that has no checkpoint"
    state = run.dir.read_checkpoint(path)
    run.dir.rollback_to(state)
    run.step = state["step"]
    run.population = Population.from_dict(state["population"])
    run.coverage = defaultdict(set, {k: set(v) for k, v in state["coverage"].items()})
    for name, task in run.tasks.items():
        task.load_state_dict(pickle.loads((path / "tasks" / f"{name}.pkl").read_bytes()))
    if state.get("matchmaker") is not None:
        run.matchmaker.load_state_dict(state["matchmaker"])
    run.trainer.load_state(path / "trainer")
    run.evolution_deferred = state.get("evolution_deferred")


def checkpoint(run: Run) -> Path:
    """Write a complete checkpoint of the run atomically (population, coverage, tasks, matchmaker, trainer)."""

    def write_tasks(directory: Path) -> None:
        for name, task in run.tasks.items():
            (directory / f"{name}.pkl").write_bytes(pickle.dumps(task.state_dict()))

    state = {
        "population": run.population.to_dict(),
        "coverage": {k: sorted(v) for k, v in run.coverage.items()},
        "matchmaker": run.matchmaker.state_dict(),
        "evolution_deferred": run.evolution_deferred,
    }
    extra = {"tasks": write_tasks, "trainer": run.trainer.save_state}
    path = run.dir.write_checkpoint(run.step, state, extra, keep=run.recipe.checkpoint.keep)
    run.hook.on_checkpoint(run=run.view(), step=run.step, path=str(path))
    return path


def prune_adapters(run: Run) -> list[str]:
    """Delete the adapter versions the recipe's ``adapters.keep`` lets go; returns their names.

    Never deleted: a living member's current and first version, and every version that a complete
    checkpoint still on disk restores (so ``populora resume`` and ``populora eval`` always find theirs).
    """
    import shutil

    policy = run.recipe.adapters
    if policy.keep == "all":
        return []
    living = run.population.members.values()
    needed = {m.version_name for m in living} | {f"{m.id}@v0" for m in living}
    if policy.keep == "last":
        needed |= {f"{m.id}@v{v}" for m in living for v in range(max(0, m.version - policy.last + 1), m.version)}
    for path in run.dir.complete_checkpoints():
        population = Population.from_dict(run.dir.read_checkpoint(path)["population"])
        needed |= {m.version_name for m in population.members.values()}
    pruned = sorted(p.name for p in run.dir.adapters.iterdir() if not p.name.startswith(".") and p.name not in needed)
    for name in pruned:
        shutil.rmtree(run.dir.adapter_path(name))
    return pruned
