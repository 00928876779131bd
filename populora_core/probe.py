"""Moved to :mod:`populora_core.api.probe` in plugin API 7; this path goes in plugin API 8."""

import sys
import warnings

from .api import probe as _moved
from .api.probe import *  # noqa: F403  (the names, for type checkers)

warnings.warn(
    "populora_core.probe moved to populora_core.api.probe; the old path goes in plugin API 8",
    FutureWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
