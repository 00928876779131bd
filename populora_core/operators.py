"""Moved to :mod:`populora_core.api.operators` in plugin API 7; this path goes in plugin API 8."""

import sys
import warnings

from .api import operators as _moved
from .api.operators import *  # noqa: F403  (the names, for type checkers)

warnings.warn(
    "populora_core.operators moved to populora_core.api.operators; the old path goes in plugin API 8",
    FutureWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
