"""Test plugin: Ray workers that cannot reach the driver's run directory, as on nodes without a shared filesystem.

Loaded with the run's plugin files (every Ray worker loads the driver's at start). In a process whose environment
names ``POPULORA_TEST_UNSHARED`` (the workers', through ``cluster.params.runtime_env``) an audit hook refuses, with
PermissionError, every open, listing, creation, rename or removal under that folder. safetensors reads its files
in Rust, past the hook, but every adapter read opens the version's config first.
"""

from __future__ import annotations

import os
import sys

ROOT = os.environ.get("POPULORA_TEST_UNSHARED", "")
EVENTS = frozenset({"open", "os.listdir", "os.scandir", "os.mkdir", "os.rename", "os.remove", "os.rmdir"})


def _under_root(path: object) -> bool:
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False  # a file descriptor
    full = os.path.abspath(os.fsdecode(path))
    return full == ROOT or full.startswith(ROOT + os.sep)


def _refuse(event: str, args: tuple) -> None:
    if event in EVENTS and any(_under_root(arg) for arg in args[:2]):
        raise PermissionError(f"{event} {args[0]!r}: this Ray worker's node does not share {ROOT}")


if ROOT:
    ROOT = os.path.abspath(ROOT)
    sys.addaudithook(_refuse)
