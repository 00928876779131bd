"""Moved to :mod:`populora_core.api.trainer_state` in plugin API 7; this path goes in plugin API 8."""

import sys
import warnings

from .api import trainer_state as _moved
from .api.trainer_state import *  # noqa: F403  (the names, for type checkers)

warnings.warn(
    "populora_core.trainer_state moved to populora_core.api.trainer_state; the old path goes in plugin API 8",
    FutureWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
