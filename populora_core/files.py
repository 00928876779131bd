"""Atomic writes: a reader sees a file or folder's old content or its new content, never part of either.

Each writes a temporary sibling (a dot name in the same folder, so one file system) and renames it over the
target with ``os.replace``; on any error the temporary is removed and the target is left as it was.
"""

from __future__ import annotations

import os
import secrets
import shutil
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
        if replace and dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
