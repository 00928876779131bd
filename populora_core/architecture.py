"""Moved to :mod:`populora_core.api.architecture` in plugin API 7; this path goes in plugin API 8."""

import sys
import warnings

from .api import architecture as _moved
from .api.architecture import *  # noqa: F403  (the names, for type checkers)

warnings.warn(
    "populora_core.architecture moved to populora_core.api.architecture; the old path goes in plugin API 8",
    FutureWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
