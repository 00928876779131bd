"""A checkpoint's trainer state as one file per member plus a manifest, so any worker count can load it.

Layout of a checkpoint's ``trainer/`` folder::

    manifest.json          {"format": 2, "algorithm": "trr++", "members": {"s0": "members/s0.pt", ...}}
    members/<member>.pt    that member's state, in the trainer's own file format

A run saved by one process resumes on a cluster of any size and back: whoever loads reads the manifest and
loads only the members it owns. No torch here: the member files are the trainer's business.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..api.errors import UserError
from ..api.names import MEMBER_ID
from .files import atomic_write_text

MANIFEST = "manifest.json"
FORMAT = 2


def write_manifest(directory: Path, algorithm: str, files: dict[str, str]) -> None:
    """Record which file holds each member's state (paths relative to ``directory``), atomically, last."""
    data = {"format": FORMAT, "algorithm": algorithm, "members": dict(sorted(files.items()))}
    atomic_write_text(Path(directory) / MANIFEST, json.dumps(data, indent=1))


def read_manifest(directory: Path, algorithm: str) -> dict[str, Any]:
    """The manifest of a trainer state saved by ``algorithm`` (a :class:`UserError` when there is none)."""
    file = Path(directory) / MANIFEST
    if not file.is_file():
        raise UserError(f"trainer state not found: {file}")
    data = json.loads(file.read_text())
    if data.get("format") != FORMAT:
        raise UserError(f"{file}: trainer state format {data.get('format')!r}, this version reads {FORMAT}")
    if data.get("algorithm") != algorithm:
        raise UserError(f"{file}: saved by trainer {data.get('algorithm')!r}, not {algorithm!r}")
    missing = [m for m, rel in data["members"].items() if not (Path(directory) / rel).is_file()]
    if missing:
        raise UserError(f"{file}: the state files of member(s) {', '.join(sorted(missing))} are missing")
    return data


def member_file(member_id: str) -> str:
    """Where a member's state goes, relative to the trainer folder (member ids are short slugs: ``s3``)."""
    if not isinstance(member_id, str) or MEMBER_ID.fullmatch(member_id) is None:
        raise UserError(f"member id {member_id!r} cannot name a state file")
    return f"members/{member_id}.pt"
