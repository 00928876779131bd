"""PopuLoRA core: population, matchmaking and the training loop as pluggy hooks.

What plugins may import (``tests/test_import_rules.py`` enforces it): this package's names below and the
modules in :data:`PUBLIC_MODULES`. Nothing here imports torch.
"""

from .errors import PluginError, PopuloraError, RecipeError, UserError
from .hookspecs import hookimpl
from .plugins import get_registry
from .registry import Component, NoParams, Params, Registry, format_validation_error

__version__ = "0.1.0"

#: The version of what plugins rely on: hook specifications, ``register_*`` keywords and PUBLIC_MODULES. It
#: changes when any of them changes; a renamed keyword keeps working, with a FutureWarning, for one version
#: (CHANGELOG.md, "For plugin authors").
PLUGIN_API_VERSION = 6

#: The core modules a plugin may import, and what each is for. Everything else in the core is private.
PUBLIC_MODULES = {
    "populora_core": "hookimpl, Params, errors, get_registry(): look up and build components",
    "populora_core.components": "the Protocols each component kind implements and the data passed between them",
    "populora_core.adapters": "LoRA factors <-> PEFT directories (and their served copies), compatibility checks, "
    "fresh adapters",
    "populora_core.runview": "RunView, what every lifecycle hook receives as ``run``",
    "populora_core.population": "members, ratings, lineage, compute counters, selection_history of a lineage",
    "populora_core.problems": "files of Problem records",
    "populora_core.errors": "UserError, RecipeError, PluginError",
    "populora_core.files": "atomic writes of a file or a folder (atomic_write_text/bytes, atomic_path, atomic_dir)",
    "populora_core.runtime": "the one owner of torch's thread count: set_torch_threads (a worker process), "
    "torch_threads (a scoped section)",
    "populora_core.rng": "seeds derived from (seed, step, phase)",
    "populora_core.modelhost": "the process-wide shared base model that engines and trainers add adapters to",
    "populora_core.probe": "greedy probe accuracy of adapters on a set of problems",
    "populora_core.operators": "operator arity and apply_operator, the checked way to make one child; readiness, "
    "child ratings and select, the checked way to call a selector",
    "populora_core.trainer_state": "a checkpoint's trainer state: one file per member plus a manifest",
    "populora_core.architecture": "a base model's shape from its config alone (Arch, dtype_bytes, GIB)",
    "populora_core.memory": "what an engine's or trainer's register(..., memory=fn) reports to populora plan; "
    "the visible GPU's memory",
}

__all__ = [
    "PLUGIN_API_VERSION",
    "PUBLIC_MODULES",
    "Component",
    "NoParams",
    "Params",
    "PluginError",
    "PopuloraError",
    "RecipeError",
    "Registry",
    "UserError",
    "__version__",
    "format_validation_error",
    "get_registry",
    "hookimpl",
]
