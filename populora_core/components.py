"""Moved to :mod:`populora_core.api.components` in plugin API 7; this path goes in plugin API 8."""

import sys
import warnings

from .api import components as _moved
from .api.components import *  # noqa: F403  (the names, for type checkers)

warnings.warn(
    "populora_core.components moved to populora_core.api.components; the old path goes in plugin API 8",
    FutureWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
