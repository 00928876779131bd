"""Moved to :mod:`populora_core.api.modelhost` in plugin API 7; this path goes in plugin API 8."""

import sys
import warnings

from .api import modelhost as _moved
from .api.modelhost import *  # noqa: F403  (the names, for type checkers)

warnings.warn(
    "populora_core.modelhost moved to populora_core.api.modelhost; the old path goes in plugin API 8",
    FutureWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
