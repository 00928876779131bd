"""Run directory: resolved recipe, append-only logs, immutable adapters, atomic checkpoints.

Layout::

    RUN/recipe.yaml  events.jsonl  lineage.jsonl  members.json  run.log (what the terminal showed)
        adapters/<member>@v<k>/      PEFT dirs, never overwritten
        tasks/problems.jsonl          every proposed problem (``datasets.load_dataset("json", ...)``)
        checkpoints/<step>/  LATEST   complete checkpoints; LATEST names the newest

A checkpoint is written into a temporary folder and renamed into place, then LATEST is replaced
atomically, so a kill at any instant leaves the previous complete checkpoint readable. It records
the byte length of every append-only log, a copy of the recipe and a manifest (size, sha256) of its files
and of the adapter files it restores; resuming from the newest intact checkpoint (:mod:`.checkpoints`)
truncates the logs back to those lengths and deletes adapter versions written after it, so nothing logged
before the checkpoint is lost and nothing after it is duplicated. When a newer checkpoint is damaged, it and
everything only it needed are moved to ``RUN/damaged/<time>/`` instead (:func:`.recovery.set_aside`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from ..api.errors import UserError
from ..services.files import atomic_dir, atomic_write_text, is_disk_full, tree_bytes
from .checkpoints import RECIPE_COPY, ResumePoint, find_resume_point, manifest

LOGS = ("events.jsonl", "lineage.jsonl", "tasks/problems.jsonl", "probe.jsonl")


class RunDir:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None  # RUN/.lock while this process runs the run
        self._resume_point: ResumePoint | None = None
        self.notes: list[str] = []  # what a resume found and did about damage, for the terminal and run.log
        self._damaged: Path | None = None  # RUN/damaged/<time>/ once a resume set something aside
        self._made_folder = False  # create() made the folder itself (a failed start removes it again)
        self._made_lock_file = False  # lock() made RUN/.lock
        self._claimed = False  # create() found the folder new or empty with its lock held: what is in it is ours

    # --- layout -----------------------------------------------------------------------------

    @property
    def adapters(self) -> Path:
        return self.path / "adapters"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def adapter_path(self, version_name: str) -> Path:
        """``adapters/<id>@v<k>``; any other name (``../../OTHER/adapters/t0@v3``) is refused, exit 2 naming it."""
        from ..api.names import VERSION_NAME, check_name, inside

        return inside(self.adapters, check_name(version_name, VERSION_NAME, "adapter version"), "adapter version")

    def create(self, resolved_recipe: dict[str, Any], *, exist_ok: bool = False) -> None:
        """Claim the folder for a new run, then write its skeleton and recipe.

        The folder is made (``mkdir``, which only one process can do) and locked before anything is checked or
        written, so of two starts racing on one new ``--run-dir`` one runs and the other is refused having written
        nothing; :meth:`discard_new` then removes only what this process made."""
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"--run-dir {self.path} is a file, not a directory: choose a new or empty directory")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.path.mkdir()
                self._made_folder = True
            except FileExistsError:
                pass
            if self._lock_fd is None:
                self.lock()
        except OSError as exc:  # read-only, not ours, a full disk
            self.discard_new()
            raise UserError(
                f"--run-dir {self.path}: cannot write there ({exc.strerror}: {exc.filename}); choose a writable place"
            ) from None
        except UserError:  # another process holds it: it is that one's, nothing here is ours to remove
            self._made_folder = False
            raise
        if (self.path / "recipe.yaml").exists() and not exist_ok:
            self._release_claim()
            raise UserError(self._holds_a_run())
        if not exist_ok and any(entry.name != ".lock" for entry in self.path.iterdir()):
            self._release_claim()
            raise UserError(
                f"--run-dir {self.path} holds other files and no run (no recipe.yaml): a run writes and deletes "
                "files there, so choose a new or empty directory"
            )
        self._claimed = True
        try:
            for sub in ("adapters", "checkpoints", "tasks"):
                (self.path / sub).mkdir(parents=True, exist_ok=True)
            self.write_recipe(resolved_recipe)
        except OSError as exc:  # read-only, not ours, a full disk
            self.discard_new()
            raise UserError(
                f"--run-dir {self.path}: cannot write there ({exc.strerror}: {exc.filename}); choose a writable place"
            ) from None

    def _holds_a_run(self) -> str:
        """Why ``run`` will not start in this directory, with the command that does what was likely meant: a
        finished run is extended by ``resume ... steps=N`` (a plain resume has nothing left to do), a stopped one
        continued by ``resume``."""
        try:
            planned = int((yaml.safe_load((self.path / "recipe.yaml").read_text()) or {}).get("steps", 0) or 0)
        except (OSError, yaml.YAMLError, AttributeError, TypeError, ValueError):
            planned = 0
        done = self.checkpointed_step()
        if planned and done >= planned:
            return (
                f"run directory {self.path} holds a finished run ({done} of {planned} steps): "
                f"`populora resume {self.path} steps={planned * 2}` extends it (to any steps=N above {planned}), "
                "or choose another --run-dir for a new run"
            )
        return (
            f"run directory {self.path} already holds a run ({done} of {planned or '?'} steps checkpointed); "
            f"`populora resume {self.path}` continues it, or choose another --run-dir"
        )

    def _release_claim(self) -> None:
        """Refused after locking: the lock file goes if this process made it, the lock is let go, nothing else."""
        if self._made_lock_file:
            (self.path / ".lock").unlink(missing_ok=True)
            self._made_lock_file = False
        self.unlock()

    def lock(self) -> None:
        """Hold ``RUN/.lock`` while this process runs the run: a second ``run``/``resume`` of the same directory
        would interleave its logs and checkpoints, so it is refused (the lock goes with the process, even on kill)."""
        import fcntl

        try:
            fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            made = True
        except FileExistsError:
            fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            made = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise UserError(
                f"run directory {self.path} is in use by another populora process (pid {holder}); "
                "wait for it to end or stop it, then `populora resume` it"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd, self._made_lock_file = fd, made

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def running_pid(self) -> int | None:
        """The pid of the process running this run now, else None."""
        import fcntl

        try:
            fd = os.open(self.path / ".lock", os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 32).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        finally:
            os.close(fd)
        return None

    def log_line(self, text: str) -> None:
        """Append a timestamped line to ``RUN/run.log``: what the terminal showed, without the bar, across resumes
        (not rolled back with the logs: it is the run's history as a person saw it)."""
        import time

        with open(self.path / "run.log", "a") as fh:
            fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")

    def write_recipe(self, resolved_recipe: dict[str, Any]) -> None:
        """Replace the resolved recipe (resume on another cluster changes its ``cluster`` section)."""
        atomic_write_text(self.path / "recipe.yaml", yaml.safe_dump(resolved_recipe, sort_keys=False))

    def discard_new(self) -> None:
        """Remove everything a run that failed to start wrote: :meth:`create` claimed the folder new or empty under
        its lock, so all in it is this process's; a folder the user made empty is left, empty. Without the claim
        (another process holds the folder) nothing is removed."""
        if not self._claimed or self._lock_fd is None:
            self.unlock()
            if self._made_folder and self.path.is_dir() and not any(self.path.iterdir()):
                self.path.rmdir()
            return
        for entry in self.path.iterdir():
            if entry.name == ".lock":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        if self._made_lock_file or self._made_folder:
            (self.path / ".lock").unlink(missing_ok=True)  # still held: nobody else can have claimed it
        self._claimed = False
        self.unlock()
        if self._made_folder:
            try:
                self.path.rmdir()
            except OSError:  # someone put something there after the lock file went: theirs
                pass

    def read_recipe(self) -> dict[str, Any]:
        file = self.path / "recipe.yaml"
        if not file.is_file():
            raise UserError(f"{self.path} is not a run directory (no recipe.yaml)")
        try:
            data = yaml.safe_load(file.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise UserError(f"{file} is unreadable ({type(exc).__name__})") from None
        if not isinstance(data, dict):
            raise UserError(f"{file} is not a recipe mapping")
        return data

    # --- append-only logs ---------------------------------------------------------------------

    def append(self, log: str, records: list[dict[str, Any]]) -> None:
        """Append JSON lines and flush (one write call per batch keeps lines whole)."""
        if not records:
            return
        file = self.path / log
        file.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(json.dumps(r, default=_json_default) + "\n" for r in records)
        with open(file, "a") as fh:
            fh.write(data)
            fh.flush()

    def read_log(self, log: str) -> list[dict[str, Any]]:
        file = self.path / log
        if not file.exists():
            return []
        return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]

    def adapter_names(self) -> list[str]:
        """The adapter versions on disk (a dot name is a write in progress)."""
        return sorted(p.name for p in self.adapters.iterdir() if not p.name.startswith("."))

    def log_sizes(self) -> dict[str, int]:
        return {log: (self.path / log).stat().st_size if (self.path / log).exists() else 0 for log in LOGS}

    # --- checkpoints --------------------------------------------------------------------------

    def write_checkpoint(
        self,
        step: int,
        state: dict[str, Any],
        extra_dirs: dict[str, Any] | None = None,
        keep: int = 2,
        restores: list[str] | tuple[str, ...] = (),
        log_sizes: dict[str, int] | None = None,
        adapters: list[str] | None = None,
    ) -> Path:
        """Atomically write ``state`` (JSON) plus component state dirs filled by ``extra_dirs`` callbacks, a copy
        of the recipe and the manifest of it all and of the adapter versions it ``restores``. ``log_sizes`` and
        ``adapters``: the logs' lengths and the adapter versions when the step ended (default: now)."""
        final = self.checkpoints / f"{step:08d}"
        needed = self.check_space(step)
        try:
            with atomic_dir(final, replace=True) as tmp:
                try:
                    self._fill_checkpoint(tmp, state, step, extra_dirs, restores, log_sizes, adapters)
                except (OSError, RuntimeError) as exc:
                    if not is_disk_full(exc, tmp):
                        raise
                    raise self._no_space(step, max(needed, tree_bytes(tmp)), during=True) from None
            atomic_write_text(self.checkpoints / "LATEST", final.name + "\n")
            atomic_write_text(self.path / "members.json", json.dumps(state.get("population", {}), indent=1))
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise self._no_space(step, needed, during=True) from None
        self._prune(keep)
        return final

    def _fill_checkpoint(
        self,
        tmp: Path,
        state: dict[str, Any],
        step: int,
        extra_dirs: dict[str, Any] | None,
        restores: list[str] | tuple[str, ...],
        log_sizes: dict[str, int] | None,
        adapters: list[str] | None,
    ) -> None:
        for name, writer in (extra_dirs or {}).items():
            sub = tmp / name
            sub.mkdir()
            writer(sub)
        if (self.path / "recipe.yaml").is_file():
            shutil.copyfile(self.path / "recipe.yaml", tmp / RECIPE_COPY)
        full = dict(
            state,
            step=step,
            log_sizes=self.log_sizes() if log_sizes is None else log_sizes,
            adapters=self.adapter_names() if adapters is None else adapters,
            manifest=manifest(tmp, self.adapters, list(restores)),
        )
        (tmp / "state.json").write_text(json.dumps(full, default=_json_default))

    def checkpoint_bytes(self) -> int:
        """The size of the newest checkpoint on disk (0 without one): what the next one needs, about."""
        newest = self.latest_checkpoint()
        return tree_bytes(newest) if newest is not None else 0

    def check_space(self, step: int | None = None) -> int:
        """Refuse a checkpoint the disk cannot hold before writing any of it (the newest one's size is the
        measure); returns that size. ``step``: the checkpoint about to be written (None: at a resume's start)."""
        needed = self.checkpoint_bytes()
        if needed and shutil.disk_usage(self.checkpoints).free < needed:
            raise self._no_space(step, needed, during=False)
        return needed

    def _no_space(self, step: int | None, needed: int, *, during: bool) -> UserError:
        free = shutil.disk_usage(self.checkpoints).free
        kept = self.latest_checkpoint()
        what = f"the checkpoint of step {step}" if step is not None else "the next checkpoint"
        when = "ran out of space while writing it" if during else "does not have it free"
        intact = f"the checkpoint of step {int(kept.name)} is intact" if kept is not None else "no checkpoint was lost"
        return UserError(
            f"no space left for {what} in {self.checkpoints}: it needs about {needed:,} bytes and the disk {when} "
            f"({free:,} bytes free); {intact}. Free space there (or move the run), then `populora resume {self.path}`"
        )

    def complete_checkpoints(self) -> list[Path]:
        """Every checkpoint on disk whose state reads, oldest first."""
        readable = []
        for path in sorted(p for p in self.checkpoints.iterdir() if p.name.isdigit()):
            try:
                self.read_checkpoint(path)
            except (OSError, ValueError):
                continue
            readable.append(path)
        return readable

    def _prune(self, keep: int) -> None:
        complete = sorted(p for p in self.checkpoints.iterdir() if p.is_dir() and p.name.isdigit())
        for old in complete[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.checkpoints.glob(".*"):  # temporaries of writes a crash interrupted
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)

    def checkpointed_step(self) -> int:
        """The step of the newest intact checkpoint (sizes checked, not hashes), 0 when there is none."""
        return find_resume_point(self.path, hashes=False).step

    def latest_checkpoint(self) -> Path | None:
        """The newest intact checkpoint (sizes checked, not hashes), None when there is none."""
        found = find_resume_point(self.path, hashes=False).checkpoint
        return found.path if found is not None else None

    def resume_point(self) -> ResumePoint:
        """Where a resume goes on from, every recorded hash checked (once per RunDir: it reads every file)."""
        if self._resume_point is None:
            self._resume_point = find_resume_point(self.path, hashes=True)
        return self._resume_point

    def read_checkpoint(self, path: Path) -> dict[str, Any]:
        return json.loads((path / "state.json").read_text())

    def damaged_folder(self) -> Path:
        if self._damaged is None:
            import time

            self._damaged = self.path / "damaged" / time.strftime("%Y%m%dT%H%M%S")
        return self._damaged


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
