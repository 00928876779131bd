"""Moved to :mod:`populora_core.api.population` in plugin API 7; this path goes in plugin API 8."""

import sys
import warnings

from .api import population as _moved
from .api.population import *  # noqa: F403  (the names, for type checkers)

warnings.warn(
    "populora_core.population moved to populora_core.api.population; the old path goes in plugin API 8",
    FutureWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
