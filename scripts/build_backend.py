"""setuptools' build backend, except that building a wheel leaves no ``build/`` folder in the source tree.

pip builds in the tree; setuptools' ``bdist_wheel`` stages the files under ``build/`` and keeps them. A ``build/`` this
build created is removed after it (one that was there before is left alone).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (the rest of the PEP 517 and PEP 660 hooks, unchanged)


def build_wheel(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    staging = Path("build")
    existed = staging.exists()
    try:
        return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    finally:
        if not existed:
            shutil.rmtree(staging, ignore_errors=True)
