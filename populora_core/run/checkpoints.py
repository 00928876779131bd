"""Which checkpoint a run resumes from: the newest *intact* one, never ``LATEST`` blindly.

A checkpoint records a manifest of its own files and of the adapter files its population restores (byte size and
sha256). Intact means: ``state.json`` reads, every recorded file is there with its size (and hash, when asked),
every adapter version the population restores is there. A resume trusts only an intact checkpoint; a damaged newer
one is set aside with what only it needed (:func:`.recovery.set_aside`), never deleted, so days of GPU time are not
thrown away by one torn file. A run is cleared to start over only when it provably never completed a checkpoint:
no ``LATEST``, no checkpoint folder, no ``members.json`` (all written by the first checkpoint).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..api.errors import UserError

#: The copy of the run's resolved recipe each checkpoint keeps (not ``recipe.yaml``: ``populora runs`` finds runs
#: by that name).
RECIPE_COPY = "run-recipe.yaml"
_STATE = "state.json"
#: How a run directory written by a version that pickled its task state is converted (the refusal names it).
CONVERT_COMMAND = "populora convert-checkpoints"


def file_record(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        return {"size": path.stat().st_size, "sha256": hashlib.file_digest(fh, "sha256").hexdigest()}


def manifest(checkpoint: Path, adapters: Path, versions: list[str]) -> dict[str, dict[str, Any]]:
    """Size and hash of every file of a checkpoint being written (``state.json`` aside) and of the files of the
    adapter versions it restores, by their paths relative to the checkpoint and to ``adapters/``."""
    own = {str(p.relative_to(checkpoint)): file_record(p) for p in sorted(checkpoint.rglob("*")) if p.is_file()}
    named = {
        str(p.relative_to(adapters)): file_record(p)
        for version in sorted(versions)
        for p in sorted((adapters / version).rglob("*"))
        if p.is_file()
    }
    return {"checkpoint": own, "adapters": named}


@dataclass
class Checkpoint:
    """One checkpoint folder as found on disk: its step, its state when readable, what is damaged (None: intact)."""

    path: Path
    step: int
    state: dict[str, Any] | None = None
    damage: str | None = None

    @property
    def intact(self) -> bool:
        return self.damage is None


@dataclass
class ResumePoint:
    """Where a run goes on from: ``checkpoint`` (None: none intact), the checkpoints newer than it that are damaged
    (``skipped``), and whether the run ever completed one (then a run without an intact checkpoint is damaged, not new).
    """

    run: Path
    checkpoint: Checkpoint | None
    skipped: list[Checkpoint] = field(default_factory=list)
    ever_checkpointed: bool = False

    @property
    def step(self) -> int:
        return self.checkpoint.step if self.checkpoint is not None else 0

    @property
    def damaged(self) -> bool:
        return bool(self.skipped) or (self.checkpoint is None and self.ever_checkpointed)

    def skipped_lines(self) -> list[str]:
        return [f"checkpoint {c.step} ({c.path.name}): {c.damage}" for c in self.skipped]

    def refusal(self) -> str:
        """The exit-2 message for a damaged run that has no intact checkpoint to resume from."""
        found = "; ".join(self.skipped_lines()) or "the checkpoints/ folder is missing or empty"
        return (
            f"run directory {self.run} is damaged and has no intact checkpoint ({found}). Nothing was changed. "
            "Restore the damaged files from a backup and resume again, or start over in a new directory: "
            f"`populora run {self.run}/recipe.yaml --run-dir NEW_DIR`"
        )


def inspect_checkpoint(run: Path, path: Path, *, hashes: bool) -> Checkpoint:
    """Read one checkpoint folder and check it against its manifest (hashes too when ``hashes``)."""
    step = int(path.name)
    found = Checkpoint(path, step)
    if not path.is_dir():
        found.damage = "missing (LATEST names it)"
        return found
    try:
        state = json.loads((path / _STATE).read_text())
    except FileNotFoundError:
        found.damage = f"{_STATE} is missing"
        return found
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        found.damage = f"{_STATE} is unreadable ({type(exc).__name__}: {exc})"
        return found
    if not isinstance(state, dict) or not {"step", "population", "log_sizes", "adapters"} <= state.keys():
        found.damage = f"{_STATE} lacks the run's state"
        return found
    found.state = state
    if state["step"] != step:
        found.damage = f"{_STATE} is of step {state['step']}, not {step}"
        return found
    recorded = state.get("manifest")
    if recorded is None:  # a checkpoint written before manifests: the files a restore needs must at least be there
        found.damage = _legacy_damage(run, path, state)
        return found
    for root, files, where in ((path, recorded["checkpoint"], path.name), (run / "adapters", recorded["adapters"], "")):
        for rel, record in files.items():
            found.damage = _file_damage(root / rel, record, hashes, f"{where}/{rel}" if where else f"adapters/{rel}")
            if found.damage is not None:
                return found
    return found


def _file_damage(file: Path, record: dict[str, Any], hashes: bool, shown: str) -> str | None:
    if not file.is_file():
        return f"{shown} is missing"
    size = file.stat().st_size
    if size != record["size"]:
        return f"{shown} has {size} bytes, {record['size']} were written"
    if hashes and file_record(file)["sha256"] != record["sha256"]:
        return f"{shown} differs from what was written (sha256)"
    return None


def _legacy_damage(run: Path, path: Path, state: dict[str, Any]) -> str | None:
    from ..api.population import Population

    for version in sorted(m.version_name for m in Population.from_dict(state["population"]).members.values()):
        folder = run / "adapters" / version
        if not folder.is_dir() or not any(f.stat().st_size for f in folder.iterdir() if f.is_file()):
            return f"adapters/{version} is missing or empty"
    for sub in ("tasks", "trainer"):
        if not (path / sub).is_dir():
            return f"{path.name}/{sub} is missing"
    return None


def find_resume_point(run: Path, *, hashes: bool = True) -> ResumePoint:
    """The newest intact checkpoint of the run at ``run`` and the damaged ones newer than it."""
    folder = run / "checkpoints"
    named = _latest_name(folder)
    steps = {int(p.name): p for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else {}
    if named is not None and int(named) not in steps:
        steps[int(named)] = folder / named
    point = ResumePoint(run, None)
    point.ever_checkpointed = bool(steps) or named is not None or (run / "members.json").exists()
    point.ever_checkpointed |= not folder.is_dir() and (run / "adapters").is_dir()
    for step in sorted(steps, reverse=True):
        found = inspect_checkpoint(run, steps[step], hashes=hashes)
        if found.intact:
            point.checkpoint = found
            break
        point.skipped.append(found)
    return point


def _latest_name(folder: Path) -> str | None:
    try:
        name = (folder / "LATEST").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if name.isdigit() else None


def pickled_task_state(checkpoint: Path) -> list[Path]:
    """The pickled task state files of a checkpoint written before task state was JSON (empty: none)."""
    folder = checkpoint / "tasks"
    return sorted(folder.glob("*.pkl")) if folder.is_dir() else []


def refuse_pickled(run: Path, checkpoint: Path) -> None:
    """Refuse to resume from a checkpoint of an older version whose task state is pickled, naming the command that
    converts it; nothing is read."""
    files = pickled_task_state(checkpoint)
    if files:
        names = ", ".join(str(f.relative_to(run)) for f in files)
        raise UserError(
            f"checkpoint {checkpoint.name} of {run} holds pickled task state ({names}), written by an older "
            "version: this one does not unpickle run directories (unpickling runs whatever the file says). "
            f"Convert the run once with `{CONVERT_COMMAND} {run}` (it reads plain data only and refuses anything "
            "else), then resume again. Nothing was changed"
        )
