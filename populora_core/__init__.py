"""PopuLoRA core: the population, the contracts of matchmaking and evolution, and the training loop, as pluggy
hooks (the matchmakers, selectors and operators themselves are plugins).

The core is five floors, each a folder that imports only the floors below it: ``api`` (what plugins may import),
``plugin`` (the plugin manager, the registry, the hook specifications), ``recipe`` (reading and validating a
recipe), ``run`` (the loop and everything a run does) and ``cli`` (the ``populora`` command). Plugins import
``populora_core.api`` and its submodules, the modules in :data:`PUBLIC_MODULES`, and nothing else of the core
(``tests/core/test_import_rules.py`` enforces it). This package still exports the names plugins took from it before
plugin API 7 (``from populora_core import hookimpl``); ``populora_core.api`` is their place now. Nothing here
imports torch.
"""

from typing import Any

from .api.errors import PluginError, PopuloraError, RecipeError, UserError
from .api.hooks import hookimpl
from .api.params import Component, NoParams, Params, format_validation_error
from .plugin.manager import get_registry
from .plugin.registry import Registry

__version__ = "0.1.0"

#: The version of what plugins rely on: hook specifications, ``register_*`` keywords and PUBLIC_MODULES. It
#: changes when any of them changes; a renamed keyword or a moved module keeps working, with a FutureWarning, for
#: one version (CHANGELOG.md, "For plugin authors"). 7: the public modules moved under ``populora_core.api``.
PLUGIN_API_VERSION = 7

#: The core modules a plugin may import (``populora_core.api`` and its submodules), and what each is for. Everything
#: else in the core is private.
PUBLIC_MODULES = {
    "populora_core.api": "hookimpl, Params, errors, get_registry(): look up and build components; build_engine(): an "
    "engine outside a run, its auto settings planned for it alone on this GPU",
    "populora_core.api.components": "the Protocols each component kind implements and the data passed between them",
    "populora_core.api.records": "the plain data passed between components (re-exported by api.components)",
    "populora_core.api.params": "Params and NoParams (a component's params model), Component (a registered one), "
    "format_validation_error",
    "populora_core.api.hooks": "hookimpl, the marker of a hook implementation",
    "populora_core.api.schema": "the recipe's typed sections and Recipe, what run.recipe is",
    "populora_core.api.adapters": "LoRA factors <-> PEFT directories (and their served copies), compatibility checks, "
    "fresh adapters",
    "populora_core.api.runview": "RunView, what every lifecycle hook receives as ``run``",
    "populora_core.api.population": "members, ratings, lineage, compute counters, selection_history of a lineage",
    "populora_core.api.problems": "files of Problem records; ProblemFileEvaluator, the data an evaluator of one "
    "shipped problem file reports",
    "populora_core.api.errors": "UserError, RecipeError, PluginError",
    "populora_core.api.files": "atomic writes of a file or a folder (atomic_write_text/bytes, atomic_path, atomic_dir)",
    "populora_core.api.runtime": "the one owner of torch's thread count: set_torch_threads (a worker process), "
    "torch_threads (a scoped section)",
    "populora_core.api.rng": "seeds derived from (seed, step, phase)",
    "populora_core.api.modelhost": "the process-wide shared base model that engines and trainers add adapters to",
    "populora_core.api.probe": "greedy probe accuracy of adapters on a set of problems; paired intervals "
    "(cluster_bootstrap) and detectable effects (cluster_mde)",
    "populora_core.api.operators": "operator arity and apply_operator, the checked way to make one child; readiness, "
    "child ratings and select, the checked way to call a selector",
    "populora_core.api.trainer_state": "a checkpoint's trainer state: one file per member plus a manifest",
    "populora_core.api.architecture": "a base model's shape from its config alone (Arch, dtype_bytes, GIB)",
    "populora_core.api.memory": "what an engine's or trainer's register(..., memory=fn) reports to populora plan; "
    "the visible GPU's memory",
    "populora_core.api.installed": "installed versions read without importing them (version, torch_cuda_version, "
    "unchecked_vllm)",
}

#: The old public paths (plugin API 6), each a shim that warns and is the moved module; removed in plugin API 8.
MOVED_MODULES = {
    f"populora_core.{name}": f"populora_core.api.{name}"
    for name in (
        "components",
        "adapters",
        "runview",
        "population",
        "problems",
        "errors",
        "files",
        "runtime",
        "rng",
        "modelhost",
        "probe",
        "operators",
        "trainer_state",
        "architecture",
        "memory",
    )
}

__all__ = [
    "MOVED_MODULES",
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
    "build_engine",
    "format_validation_error",
    "get_registry",
    "hookimpl",
]


def build_engine(name: str, params: Any, **context: Any) -> Any:
    """Engine ``name`` built outside a run (``populora eval``, a benchmark): on a GPU its ``auto`` settings chosen by
    a plan of the engine alone there. Keywords: ``who`` (the builder, named in its log line and errors),
    ``base_model``, ``lora``, ``seed``, ``log`` (a callable for the choice), and the engine's own context."""
    from .run.assembly import build_engine as build

    return build(name, params, **context)
