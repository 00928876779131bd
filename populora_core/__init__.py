"""PopuLoRA core: population, matchmaking and the training loop as pluggy hooks.

The public API plugins may use is what this package and its documented modules export:
``hookimpl``, ``Params``, the data and Protocols in ``populora_core.components``, LoRA I/O in
``populora_core.adapters``, and ``populora_core.population``. Nothing here imports torch.
"""

from .errors import PluginError, PopuloraError, RecipeError, UserError
from .hookspecs import hookimpl
from .registry import NoParams, Params

__version__ = "0.1.0"

__all__ = ["NoParams", "Params", "PluginError", "PopuloraError", "RecipeError", "UserError", "__version__", "hookimpl"]
