"""The names a run gives files and folders: a run's name, a member id, an adapter version, each one path component
that stays inside its folder (a name read from a recipe, a command line or a run directory).
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import UserError

#: A name that becomes one path component (a run's name: runs/<name>): letters, digits, '.', '_', '-', starting with
#: a letter or digit, so it cannot be '..', hold a '/' or hide itself.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: A member id (``s0``, ``t12``, ``a3``): it names the member's adapter folders (adapters/<id>@v<k>) and state files.
MEMBER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
#: An adapter version: ``<member id>@v<k>``.
VERSION_NAME = re.compile(rf"(?P<id>{MEMBER_ID.pattern})@v(?P<version>[0-9]{{1,9}})")


def check_name(value: str, pattern: re.Pattern[str], what: str) -> str:
    """``value`` when it fully matches ``pattern``; a :class:`UserError` naming it otherwise (a name read from a
    recipe, a command line or a run directory must stay inside the folder it names something in)."""
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise UserError(
            f"{what} {value!r} is not a safe name (it must match {pattern.pattern}): a name stays inside its folder"
        )
    return value


def inside(folder: Path, name: str, what: str) -> Path:
    """``folder/name``, refused (:class:`UserError`) unless it resolves inside ``folder`` (a link out, ``..``)."""
    path = folder / name
    root = folder.resolve()
    if path.resolve() != root and root not in path.resolve().parents:
        raise UserError(f"{what} {name!r} resolves outside {folder}")
    return path
