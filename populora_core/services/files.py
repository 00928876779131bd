"""Atomic writes: a reader sees a file or folder's old content or its new content, never part of either.

Each writes a temporary sibling (a dot name in the same folder, so one file system) and renames it over the
target with ``os.replace``; on any error the temporary is removed and the target is left as it was. What they
publish has the mode a plain ``open()`` gives under the process's umask, whatever wrote it: safetensors writes
0600 files, which would leave a shared results folder unreadable to colleagues.

A process killed mid-write (SIGKILL) leaves its temporary behind, named for its pid: :func:`remove_stale` removes
those of processes no longer alive (the next write of the same target calls it and says what it removed).
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | os.PathLike[str], *, fsync: bool = True) -> Iterator[Path]:
    """A temporary sibling of ``path`` for the block to write (``torch.save(obj, tmp)``); it replaces ``path``
    when the block ends. ``fsync``: flush it to disk first, so a crash after the rename cannot leave it empty."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _follow_umask(tmp, _umask())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> None:
    with atomic_path(path, fsync=fsync) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, fsync: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


@contextmanager
def atomic_dir(path: str | os.PathLike[str], *, replace: bool = False) -> Iterator[Path]:
    """A fresh empty folder beside ``path`` for the block to fill; it is renamed to ``path`` when the block ends.

    ``path`` must not exist, unless ``replace``: then an existing folder there is removed just before the rename.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # os.mkdir honours the user's umask (tempfile.mkdtemp makes 0700 folders others on a shared file system,
    # Ray workers included, cannot read); the random suffix keeps concurrent writers apart
    tmp = dest.parent / f".{dest.name}.{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        yield tmp
        mask = _umask()
        for folder, _, names in os.walk(tmp):
            for name in names:
                _follow_umask(Path(folder, name), mask)
        if replace and dest.exists():  # the old folder steps aside until the new one is in place: one set or other
            aside = dest.parent / f".{dest.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
            os.replace(dest, aside)
            try:
                os.replace(tmp, dest)
            except BaseException:
                os.replace(aside, dest)
                raise
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_stale(path: str | os.PathLike[str]) -> list[tuple[Path, int]]:
    """Remove the temporaries that atomic writes of ``path`` left when their process was killed (SIGKILL, a lost
    machine): hidden siblings ``.NAME.<pid>-<hex>`` (``.tmp``), ``.NAME.old-<pid>-<hex>`` whose process is gone
    from this machine. Returns each removed path with its size in bytes, for the caller to say."""
    target = Path(path)
    if not target.parent.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.(?:old-)?(\d+)-[0-9a-f]{{8}}(?:\.tmp)?$")
    removed = []
    for entry in target.parent.iterdir():
        match = pattern.match(entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        size = tree_bytes(entry)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append((entry, size))
    return removed


def tree_bytes(path: str | os.PathLike[str]) -> int:
    """The bytes of the files under ``path`` (a file: its size), links not followed; 0 for what vanished."""
    root = Path(path)
    try:
        if not root.is_dir() or root.is_symlink():
            return root.lstat().st_size
    except OSError:
        return 0
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def is_disk_full(exc: BaseException, where: str | os.PathLike[str] | None = None) -> bool:
    """Whether a failed write failed for want of space: ENOSPC or EDQUOT, as an OSError or in its message. torch.save
    hides the errno ("enforce fail at inline_container.cc: unexpected pos"): that counts when ``where``'s file
    system has under 64 MiB free as the write fails."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    if "No space left" in text or "Disk quota exceeded" in text:
        return True
    if "inline_container.cc" in text and where is not None:
        try:
            return shutil.disk_usage(where).free < 64 * 2**20
        except OSError:
            return False
    return False


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _umask() -> int:
    """The process's umask, read without setting it (``os.umask`` sets it, racing other threads' writes)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # no /proc (not Linux): read it by setting it back at once
    os.umask(mask)
    return mask


def _follow_umask(path: Path, mask: int) -> None:
    """Give a regular file the mode ``open()`` would have given it (0666, or 0777 if executable, less ``mask``)."""
    mode = os.lstat(path).st_mode
    if not stat.S_ISREG(mode):
        return
    wanted = (0o777 if mode & 0o111 else 0o666) & ~mask
    if stat.S_IMODE(mode) != wanted:
        os.chmod(path, wanted)
