"""Moving run-directory files through Ray's object store, for clusters whose nodes share no filesystem; adapter
paths made absolute for workers, which do not run in the driver's working directory.

With ``cluster.params.transfer: object_store`` each worker keeps a private mirror of the driver's run
directory (``mirror / <driver path>``): the driver ships the adapter versions a call reads before the call
(once per worker: versions are immutable) and fetches back what a worker wrote (new adapter versions, its
members' checkpoint files). The run directory on the driver stays the one complete record, as it is with a
shared filesystem. A version and each of its served copies (``served-bfloat16``, populora_core.services.adapters) travel
as separate units: an engine that serves in that dtype needs only the copy, a trainer only the fp32 files.
Pure file helpers here; the calls live in cluster.py and worker.py.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from populora_core.services.adapters import SERVED_PREFIX
from populora_core.services.files import atomic_write_bytes

#: driver path (a file or a directory) -> its files: relative name ("" for the path itself) -> bytes
Bundle = dict[str, dict[str, bytes]]


def mirrored(mirror: Path | None, path: str | os.PathLike[str]) -> Path:
    """Where a worker with ``mirror`` keeps the driver's ``path`` (the path itself without a mirror)."""
    path = Path(path)
    return path if mirror is None else mirror / path.relative_to(path.anchor)


def pack(paths: Iterable[str], mirror: Path | None = None) -> Bundle:
    """The files at (or under) each driver path, read from ``mirror`` (None: from the path itself); a folder's
    served copies are left out (units of their own, see :func:`units`)."""
    bundle: Bundle = {}
    for path in paths:
        here = mirrored(mirror, path)
        if here.is_file():
            bundle[path] = {"": here.read_bytes()}
        else:
            names = sorted(f.relative_to(here) for f in here.rglob("*") if f.is_file())
            kept = [n for n in names if len(n.parts) == 1 or not n.parts[0].startswith(SERVED_PREFIX)]
            bundle[path] = {str(n): (here / n).read_bytes() for n in kept}
    return bundle


def units(paths: Iterable[str], mirror: Path | None = None) -> list[str]:
    """Each driver path followed by its served copies (an adapter version's ``served-<dtype>`` folders): what
    travels, and is held by a mirror, on its own."""
    out = []
    for path in paths:
        out.append(path)
        here = mirrored(mirror, path)
        if here.is_dir():
            copies = sorted(c.name for c in here.iterdir() if c.is_dir() and c.name.startswith(SERVED_PREFIX))
            out += [str(Path(path) / name) for name in copies]
    return out


def size(bundle: Bundle) -> int:
    return sum(len(data) for files in bundle.values() for data in files.values())


def unpack(bundle: Bundle, mirror: Path | None = None) -> None:
    """Write a bundle under ``mirror`` (None: at the driver paths), each file whole or not at all."""
    for path, files in bundle.items():
        root = mirrored(mirror, path)
        for name, data in files.items():
            atomic_write_bytes(root / name if name else root, data, fsync=False)


def remove(paths: Iterable[str], mirror: Path) -> None:
    """Drop mirrored copies of driver paths the run has deleted (old adapter versions): disk stays bounded."""
    for path in paths:
        here = mirrored(mirror, path)
        if here.is_dir():
            shutil.rmtree(here, ignore_errors=True)
        else:
            here.unlink(missing_ok=True)


def absolute(ref: Any) -> Any:
    """An AdapterRef with an absolute path: workers do not run in the driver's working directory."""
    if ref is None or Path(ref.path).is_absolute():
        return ref
    return dataclasses.replace(ref, path=str(Path(ref.path).absolute()))
