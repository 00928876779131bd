"""Moved to :mod:`populora_core.api.files` in plugin API 7; this path goes in plugin API 8."""

import sys
import warnings

from .api import files as _moved
from .api.files import *  # noqa: F403  (the names, for type checkers)

warnings.warn(
    "populora_core.files moved to populora_core.api.files; the old path goes in plugin API 8",
    FutureWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
