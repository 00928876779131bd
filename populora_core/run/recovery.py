"""What a resume does about damage: the recipe checked against its checkpoint's copy, damaged checkpoints and the
work after the resume point set aside in ``RUN/damaged/<time>/`` (never deleted), the logs and adapters rolled back
to the checkpoint (:func:`roll_back`), a run with none started over (:func:`start_over`). Which checkpoint is intact is
:mod:`.checkpoints`'s answer; the run directory's layout is :mod:`.run_dir`'s."""

from __future__ import annotations

import os
import shutil
from typing import Any

import yaml

from ..api.errors import UserError
from ..services.files import atomic_write_text
from .checkpoints import RECIPE_COPY, ResumePoint, refuse_pickled
from .run_dir import LOGS, RunDir


def resume_point(run_dir: RunDir) -> ResumePoint:
    """Where a resume of ``run_dir`` goes on from, after the checks that refuse one before anything changes: a
    read-only run directory, a damaged run without an intact checkpoint, a checkpoint of an older version with pickled
    task state (all exit 2, nothing changed)."""
    check_writable(run_dir)
    point = run_dir.resume_point()
    if point.checkpoint is None and point.ever_checkpointed:
        raise UserError(point.refusal())
    if point.checkpoint is not None:
        refuse_pickled(run_dir.path, point.checkpoint.path)
    return point


def recipe_for_resume(run_dir: RunDir) -> dict[str, Any]:
    """``recipe.yaml``, checked against the copy the newest intact checkpoint keeps: a missing or unreadable
    one is restored from that copy (the damaged file set aside); one that differs in more than what a resume
    may change (``steps``, ``cluster``) is refused, since the checkpoint was made by the copy's recipe."""
    point = run_dir.resume_point()
    copy = point.checkpoint.path / RECIPE_COPY if point.checkpoint is not None else None
    if copy is None or not copy.is_file():
        return run_dir.read_recipe()
    kept = yaml.safe_load(copy.read_text())
    try:
        data = run_dir.read_recipe()
    except UserError as exc:
        damaged = run_dir.path / "recipe.yaml"
        if damaged.exists():
            run_dir.damaged_folder().mkdir(parents=True, exist_ok=True)
            shutil.move(damaged, run_dir.damaged_folder() / "recipe.yaml")
        shutil.copyfile(copy, damaged)
        run_dir.notes.append(f"{exc}: restored from checkpoint {point.step}'s copy ({copy})")
        return run_dir.read_recipe()
    changed = sorted(
        k for k in kept.keys() | data.keys() if k not in ("steps", "cluster") and kept.get(k) != data.get(k)
    )
    if changed:
        raise UserError(
            f"{run_dir.path / 'recipe.yaml'} differs from the recipe checkpoint {point.step} was made with in "
            f"{', '.join(changed)}: a resumed run keeps its recipe (only steps and cluster may change). Put it "
            f"back (`cp {copy} {run_dir.path / 'recipe.yaml'}`) and resume again; nothing was changed"
        )
    return data


def set_aside(run_dir: RunDir, point: ResumePoint) -> None:
    """Move the damaged checkpoints newer than the resume point, the adapter versions written after it and
    the log lines after it into ``RUN/damaged/<time>/``: nothing a user's GPUs made is deleted."""
    if not point.skipped or point.checkpoint is None or point.checkpoint.state is None:
        return
    state = point.checkpoint.state
    dest = run_dir.damaged_folder()
    for found in point.skipped:
        if found.path.exists():
            (dest / "checkpoints").mkdir(parents=True, exist_ok=True)
            shutil.move(found.path, dest / "checkpoints" / found.path.name)
    keep = set(state["adapters"])
    for entry in sorted(run_dir.adapters.iterdir()):
        if entry.name not in keep and not entry.name.startswith("."):
            (dest / "adapters").mkdir(parents=True, exist_ok=True)
            shutil.move(entry, dest / "adapters" / entry.name)
    for log, size in state["log_sizes"].items():
        file = run_dir.path / log
        if file.exists() and file.stat().st_size > size:
            with open(file, "rb") as fh:
                fh.seek(size)
                tail = fh.read()
            (dest / log).parent.mkdir(parents=True, exist_ok=True)
            (dest / f"{log}.after-step-{point.step}").write_bytes(tail)
    atomic_write_text(run_dir.checkpoints / "LATEST", point.checkpoint.path.name + "\n")
    run_dir.notes.append(
        f"resuming from checkpoint {point.step}, the newest intact one; skipped: "
        + "; ".join(point.skipped_lines())
        + f". The damaged checkpoints and the work after step {point.step} are kept in {dest}"
    )


def check_writable(run_dir: RunDir) -> None:
    """A run writes into its folder, its subfolders and its logs: refuse a read-only one before anything."""
    places = [run_dir.path, *(run_dir.path / sub for sub in ("adapters", "checkpoints", "tasks"))]
    places += [run_dir.path / name for name in (*LOGS, "members.json", "recipe.yaml", "run.log")]
    for place in places:
        if place.exists() and not os.access(place, os.W_OK):
            raise UserError(
                f"{place} is not writable: a run writes there; make the run directory writable "
                f"(`chmod -R u+w {run_dir.path}`) or copy it to a writable place and resume the copy"
            )


def start_over(run_dir: RunDir) -> None:
    """Undo everything a run wrote after its recipe (a run killed before its first checkpoint starts over)."""
    for sub in (run_dir.adapters, run_dir.checkpoints):
        sub.mkdir(exist_ok=True)
    roll_back(run_dir, {"log_sizes": dict.fromkeys(LOGS, 0), "adapters": []})
    for entry in run_dir.checkpoints.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink()


def roll_back(run_dir: RunDir, state: dict[str, Any]) -> None:
    """Undo everything written after a checkpoint: truncate logs, delete newer adapter versions. A log shorter
    than the checkpoint recorded lost lines already: it is kept, cut after its last whole line, and noted."""
    for log, size in state["log_sizes"].items():
        file = run_dir.path / log
        length = file.stat().st_size if file.exists() else 0
        if length > size:
            with open(file, "r+") as fh:
                fh.truncate(size)
        elif length < size:
            _keep_damaged_log(run_dir, log, length, size)
    keep = set(state["adapters"])
    for entry in run_dir.adapters.iterdir():
        if entry.name not in keep:
            shutil.rmtree(entry, ignore_errors=True)


def _keep_damaged_log(run_dir: RunDir, log: str, length: int, recorded: int) -> None:
    file = run_dir.path / log
    torn = ""
    if length:
        data = file.read_bytes()
        whole = data.rfind(b"\n") + 1
        if whole < length:  # a torn last line would break every reader of the log
            kept = run_dir.damaged_folder() / f"{log}.torn-line"
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_bytes(data[whole:])
            with open(file, "r+b") as fh:
                fh.truncate(whole)
            torn = f"; its torn last line is kept in {kept}"
    run_dir.notes.append(
        f"{log} has {length} bytes where the checkpoint recorded {recorded}: lines written before it were lost "
        f"(the run goes on and appends; its figures miss those records){torn}"
    )
