"""A run's state: the seed buffers it starts from, and the atomic checkpoints it resumes from.

A checkpoint is data, never code: a run directory travels (shared file systems, a colleague's copy, a download), so
nothing read from it may run anything. Each task's state is ``tasks/<name>.json`` (:data:`TASK_STATE_FORMAT`), the
matchmaker's is in ``state.json``, the trainer's is the trainer's own files (the built-in trainers: tensors and
plain data through ``torch.load(weights_only=True)``). Checkpoints of versions that pickled task state are refused
with the command that converts them (:func:`convert_checkpoints`), which itself reads plain data only.
"""

from __future__ import annotations

import copy
import json
import pickle
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api.errors import PluginError, UserError
from ..api.population import Population
from ..services.problems import load_problems
from .checkpoints import pickled_task_state, refuse_pickled
from .recovery import roll_back, set_aside

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


#: ``tasks/<name>.json``: ``{"format": TASK_STATE_FORMAT, "task": name, "state": <the task's state_dict()>}``, the
#: state JSON data only (objects, arrays, strings, numbers, booleans, null: tuples come back as lists).
TASK_STATE_FORMAT = "populora-task-state/1"


def task_state_file(checkpoint: Path, name: str) -> Path:
    return checkpoint / "tasks" / f"{name}.json"


def read_task_state(checkpoint: Path, name: str) -> dict[str, Any]:
    """A task's state from a checkpoint, checked against :data:`TASK_STATE_FORMAT`; a :class:`UserError` naming the
    file otherwise (a resume then changes nothing)."""
    file = task_state_file(checkpoint, name)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{file}: task {name!r}'s state is missing; nothing was changed") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{file}: not task state (JSON expected: {exc}); nothing was read or changed") from None
    if not isinstance(data, dict) or data.get("format") != TASK_STATE_FORMAT or not isinstance(data.get("state"), dict):
        raise UserError(f"{file}: not task state ({TASK_STATE_FORMAT!r}: format, task, state); nothing was changed")
    if data.get("task") != name:
        raise UserError(f"{file}: the state of task {data.get('task')!r}, not of {name!r}; nothing was changed")
    state: dict[str, Any] = data["state"]
    return state


def task_state_text(name: str, state: dict[str, Any]) -> str:
    """The text of ``tasks/<name>.json`` (also a copy of the state taken now and written later); a state that is
    not JSON data is the task plugin's error (a checkpoint holds data)."""
    try:
        return json.dumps({"format": TASK_STATE_FORMAT, "task": name, "state": state})
    except (TypeError, ValueError) as exc:
        raise PluginError(
            f"task {name!r}: state_dict() must return JSON data (dicts, lists, strings, numbers, booleans, None) "
            f"for its checkpoint: {exc}"
        ) from None


def write_task_state(directory: Path, name: str, state: dict[str, Any]) -> None:
    """``directory/<name>.json``: :func:`task_state_text` written."""
    (directory / f"{name}.json").write_text(task_state_text(name, state), encoding="utf-8")


def restore(c: Components) -> tuple[int, Population, dict[str, set[str]], int | None]:
    """Roll the run directory and every component back to the newest intact checkpoint (damaged newer ones set
    aside); returns its step, population, coverage and deferred evolution step.

    Every component's state is read (as data) before anything in the run directory changes: a checkpoint whose
    files are not what they should be is refused with nothing moved or truncated."""
    point = c.run_dir.resume_point()
    assert point.checkpoint is not None and point.checkpoint.state is not None, "resume_run checks there is one"
    path, state = point.checkpoint.path, point.checkpoint.state
    refuse_pickled(c.run_dir.path, path)
    population = Population.from_dict(state["population"])  # member ids checked: they name folders
    for name, task in c.tasks.items():
        loaded = read_task_state(path, name)
        try:
            task.load_state_dict(loaded)
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(
                f"{task_state_file(path, name)}: not the state of task {name!r} ({type(exc).__name__}: {exc}); "
                "nothing was changed"
            ) from None
    if state.get("matchmaker") is not None:
        c.matchmaker.load_state_dict(state["matchmaker"])
    try:
        c.trainer.load_state(path / "trainer")
    except pickle.UnpicklingError as exc:  # torch.load(weights_only=True) met something that is not data
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"checkpoint {path.name} of {c.run_dir.path}: the trainer state in {path / 'trainer'} holds more than "
            f"tensors and plain data, refused unread ({first}). Nothing was run or changed; to resume from the "
            f"checkpoint before it, move {path} out of {path.parent} and resume again"
        ) from None
    set_aside(c.run_dir, point)
    roll_back(c.run_dir, state)
    coverage = defaultdict(set, {k: set(v) for k, v in state["coverage"].items()})
    return state["step"], population, coverage, state.get("evolution_deferred")


@dataclass
class Snapshot:
    """What a checkpoint records of a complete step, taken when the step ended: the next step may be stopped before
    it trains, and its checkpoint is then written from this, whatever the step in progress had changed."""

    step: int
    population: Population
    state: dict[str, Any]  # population, coverage, matchmaker, evolution_deferred: copies
    tasks: dict[str, str]  # each task's state: the text of tasks/<name>.json
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
        {name: task_state_text(name, task.state_dict()) for name, task in c.tasks.items()},
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
        for name, text in snap.tasks.items():
            (directory / f"{name}.json").write_text(text, encoding="utf-8")

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
        shutil.rmtree(run_dir.adapters / name)  # a name read from the folder itself
    return pruned


class _PlainData(pickle.Unpickler):
    """Reads a pickle of plain data (dicts, lists, tuples, sets, strings, bytes, numbers, booleans, None) and
    refuses any class or function it names, so reading runs nothing."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it names {module}.{name}, not plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds a persistent reference, not plain data")


def convert_checkpoints(run: Path) -> list[Path]:
    """Rewrite the pickled task state of every checkpoint of ``run`` as ``tasks/<name>.json`` and its manifest entry
    (size, sha256) in ``state.json``; returns the files converted. Reads plain data only: a pickle naming any
    class or function is refused (:class:`UserError`) and nothing of that checkpoint is changed."""
    import io

    from ..services.files import atomic_write_text
    from .checkpoints import file_record

    folder = run / "checkpoints"
    if not folder.is_dir():
        raise UserError(f"{run} is not a run directory (no checkpoints/ folder)")
    converted = []
    for checkpoint in sorted(p for p in folder.iterdir() if p.name.isdigit() and p.is_dir()):
        files = pickled_task_state(checkpoint)
        if not files:
            continue
        states = {}
        for file in files:
            try:
                state = _PlainData(io.BytesIO(file.read_bytes())).load()
            except Exception as exc:  # anything a hostile or torn pickle raises: refused, nothing written
                raise UserError(f"{file}: not converted, {exc}; nothing of {checkpoint} was changed") from None
            if not isinstance(state, dict):
                raise UserError(f"{file}: not converted, a task state is a dict; nothing of {checkpoint} was changed")
            states[file] = state
        for file, state in states.items():
            write_task_state(file.parent, file.stem, _jsonable(state))
        state_file = checkpoint / "state.json"
        recorded = json.loads(state_file.read_text())
        own = recorded.get("manifest", {}).get("checkpoint")
        for file in states:
            if own is not None:
                own.pop(str(file.relative_to(checkpoint)), None)
                new = task_state_file(checkpoint, file.stem)
                own[str(new.relative_to(checkpoint))] = file_record(new)
        atomic_write_text(state_file, json.dumps(recorded))
        for file in states:
            file.unlink()
            converted.append(file)
    return converted


def _jsonable(value: Any) -> Any:
    """Plain pickled data as JSON data: tuples and sets as lists (sets sorted), bytes as latin-1 text."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    return value
