"""Moved to :mod:`populora_core.api.rng` in plugin API 7; this path goes in plugin API 8."""

import sys
import warnings

from .api import rng as _moved
from .api.rng import *  # noqa: F403  (the names, for type checkers)

warnings.warn(
    "populora_core.rng moved to populora_core.api.rng; the old path goes in plugin API 8", FutureWarning, stacklevel=2
)
sys.modules[__name__] = _moved
