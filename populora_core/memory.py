"""Moved to :mod:`populora_core.api.memory` in plugin API 7; this path goes in plugin API 8."""

import sys
import warnings

from .api import memory as _moved
from .api.memory import *  # noqa: F403  (the names, for type checkers)

warnings.warn(
    "populora_core.memory moved to populora_core.api.memory; the old path goes in plugin API 8",
    FutureWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
