"""A run's state: the seed buffers it starts from, and the atomic checkpoints it resumes from."""

from __future__ import annotations

import copy
import pickle
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api.errors import UserError
from ..api.population import Population
from ..api.problems import load_problems
from .recovery import set_aside

if TYPE_CHECKING:
    from ..api.schema import AdaptersSection
    from .assembly import Components
    from .run_dir import RunDir


def load_seed_problems(c: Components) -> dict[str, int] | None:
    """Fill each task's buffer with the seed problems of its type (recipe ``seeds``), before step 1; returns
    the counts per task type (``seeds/<type>``), None when the recipe loads no seeds."""
    cfg = c.recipe.seeds
    if not cfg.enabled:
        return None
    problems = load_problems(cfg.file, c.tasks)
    counts = {}
    for name, task in c.tasks.items():
        own = [p for p in problems if p.task_type == name and p.valid]
        task.add_to_buffer(own)
        counts[name] = len(own)
    if not any(counts.values()):
        kinds = ", ".join(c.tasks)
        raise UserError(f"seeds file {cfg.file}: no valid problem of the recipe's task types ({kinds})")
    return {f"seeds/{k}": v for k, v in counts.items()}


def restore(c: Components) -> tuple[int, Population, dict[str, set[str]], int | None]:
    """Roll the run directory and every component back to the newest intact checkpoint (damaged newer ones set
    aside); returns its step, population, coverage and deferred evolution step."""
    point = c.run_dir.resume_point()
    assert point.checkpoint is not None and point.checkpoint.state is not None, "resume_run checks there is one"
    path, state = point.checkpoint.path, point.checkpoint.state
    set_aside(c.run_dir, point)
    c.run_dir.rollback_to(state)
    for name, task in c.tasks.items():
        task.load_state_dict(pickle.loads((path / "tasks" / f"{name}.pkl").read_bytes()))
    if state.get("matchmaker") is not None:
        c.matchmaker.load_state_dict(state["matchmaker"])
    c.trainer.load_state(path / "trainer")
    coverage = defaultdict(set, {k: set(v) for k, v in state["coverage"].items()})
    return state["step"], Population.from_dict(state["population"]), coverage, state.get("evolution_deferred")


@dataclass
class Snapshot:
    """What a checkpoint records of a complete step, taken when the step ended: the next step may be stopped before
    it trains, and its checkpoint is then written from this, whatever the step in progress had changed."""

    step: int
    population: Population
    state: dict[str, Any]  # population, coverage, matchmaker, evolution_deferred: copies
    tasks: dict[str, bytes]  # each task's pickled state
    log_sizes: dict[str, int]
    adapters: list[str]


def snapshot(
    c: Components, step: int, population: Population, coverage: dict[str, set[str]], evolution_deferred: int | None
) -> Snapshot:
    """The run's state after ``step``, copied (population, coverage, tasks, matchmaker, log lengths, adapters on
    disk); the trainer's is read when the checkpoint is written, as nothing before training changes it."""
    members = population.to_dict()
    state: dict[str, Any] = {
        "population": members,
        "coverage": {k: sorted(v) for k, v in coverage.items()},
        "matchmaker": copy.deepcopy(c.matchmaker.state_dict()),
        "evolution_deferred": evolution_deferred,
    }
    return Snapshot(
        step,
        Population.from_dict(members),
        state,
        {name: pickle.dumps(task.state_dict()) for name, task in c.tasks.items()},
        c.run_dir.log_sizes(),
        c.run_dir.adapter_names(),
    )


def checkpoint(
    c: Components, step: int, population: Population, coverage: dict[str, set[str]], evolution_deferred: int | None
) -> Path:
    """Write a complete checkpoint of the run atomically (population, coverage, tasks, matchmaker, trainer)."""
    return write_snapshot(c, snapshot(c, step, population, coverage, evolution_deferred))


def write_snapshot(c: Components, snap: Snapshot) -> Path:
    """A complete checkpoint of ``snap``'s step, written atomically; the trainer's state as it is now."""

    def write_tasks(directory: Path) -> None:
        for name, data in snap.tasks.items():
            (directory / f"{name}.pkl").write_bytes(data)

    extra = {"tasks": write_tasks, "trainer": c.trainer.save_state}
    restores = [m.version_name for m in snap.population.members.values()]
    return c.run_dir.write_checkpoint(
        snap.step,
        snap.state,
        extra,
        keep=c.recipe.checkpoint.keep,
        restores=restores,
        log_sizes=snap.log_sizes,
        adapters=snap.adapters,
    )


def prune_adapters(run_dir: RunDir, population: Population, policy: AdaptersSection) -> list[str]:
    """Delete the adapter versions the recipe's ``adapters.keep`` lets go; returns their names.

    Never deleted: a living member's current and first version, and every version that a complete
    checkpoint still on disk restores (so ``populora resume`` and ``populora eval`` always find theirs).
    """
    import shutil

    if policy.keep == "all":
        return []
    living = population.members.values()
    needed = {m.version_name for m in living} | {f"{m.id}@v0" for m in living}
    if policy.keep == "last":
        needed |= {f"{m.id}@v{v}" for m in living for v in range(max(0, m.version - policy.last + 1), m.version)}
    for path in run_dir.complete_checkpoints():
        recorded = Population.from_dict(run_dir.read_checkpoint(path)["population"])
        needed |= {m.version_name for m in recorded.members.values()}
    pruned = sorted(p.name for p in run_dir.adapters.iterdir() if not p.name.startswith(".") and p.name not in needed)
    for name in pruned:
        shutil.rmtree(run_dir.adapter_path(name))
    return pruned
