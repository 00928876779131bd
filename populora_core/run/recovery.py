"""What a resume does about damage: the recipe checked against its checkpoint's copy, damaged checkpoints and the
work after the resume point set aside in ``RUN/damaged/<time>/`` (never deleted). Which checkpoint is intact is
:mod:`.checkpoints`'s answer; the run directory's layout is :mod:`.run_dir`'s."""

from __future__ import annotations

import shutil
from typing import Any

import yaml

from ..api.errors import UserError
from ..services.files import atomic_write_text
from .checkpoints import RECIPE_COPY, ResumePoint, refuse_pickled
from .run_dir import RunDir


def resume_point(run_dir: RunDir) -> ResumePoint:
    """Where a resume of ``run_dir`` goes on from, after the checks that refuse one before anything changes: a
    read-only run directory, a damaged run without an intact checkpoint, a checkpoint of an older version with pickled
    task state (all exit 2, nothing changed)."""
    run_dir.check_writable()
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
