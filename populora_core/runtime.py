"""Moved to :mod:`populora_core.api.runtime` in plugin API 7; this path goes in plugin API 8."""

import sys
import warnings

from .api import runtime as _moved
from .api.runtime import *  # noqa: F403  (the names, for type checkers)

warnings.warn(
    "populora_core.runtime moved to populora_core.api.runtime; the old path goes in plugin API 8",
    FutureWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
