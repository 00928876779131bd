"""PopuLoRA core: the population, the contracts of matchmaking and evolution, and the training loop, as pluggy
hooks (the matchmakers, selectors and operators themselves are plugins).

The core is six floors, each a folder that imports only the floors below it: ``api`` (the contracts a plugin
implements or receives), ``services`` (what a plugin calls: the shared base model, adapter files, the GPU, torch's
threads, atomic writes, the probe, statistics), ``plugin`` (the plugin manager, the registry, the hook
specifications), ``recipe`` (reading and validating a recipe), ``run`` (the loop and everything a run does) and
``cli`` (the ``populora`` command). Plugins import the modules in :data:`PUBLIC_MODULES` (``populora_core.api``,
``populora_core.services`` and their submodules) and nothing else of the core (``tests/core/test_import_rules.py``
enforces it). This package re-exports ``populora_core.api``'s names (one list: ``api.__all__``). Nothing here
imports torch.
"""

from . import api
from .api import *  # noqa: F403  (api.__all__: hookimpl, Params, the errors, get_registry, build_engine, ...)

__version__ = "0.1.0"

#: The version of what plugins rely on: hook specifications, ``register_*`` keywords and PUBLIC_MODULES. It
#: changes when any of them changes (CHANGELOG.md, "For plugin authors"). 7: the public modules moved under
#: ``populora_core.api``; 8: the services left ``api`` for ``populora_core.services``, the old paths of 6 are gone.
PLUGIN_API_VERSION = 8

#: The core modules a plugin may import (``populora_core.api``, ``populora_core.services`` and their submodules),
#: and what each is for. Everything else in the core is private.
PUBLIC_MODULES = {
    "populora_core.api": "hookimpl, Params, errors, get_registry(): look up and build components; build_engine(): an "
    "engine outside a run, its auto settings planned for it alone on this GPU",
    "populora_core.api.components": "the Protocols each component kind implements, with the records and the task "
    "contract (it exports both)",
    "populora_core.api.records": "the plain data passed between components (exported by api.components)",
    "populora_core.api.tasks": "the Task Protocol (exported by api.components)",
    "populora_core.api.params": "Params and NoParams (a component's params model), Component (a registered one), "
    "format_validation_error",
    "populora_core.api.hooks": "hookimpl, the marker of a hook implementation",
    "populora_core.api.schema": "the recipe's typed sections and Recipe, what run.recipe is",
    "populora_core.api.lora": "LoraWeights and LoraFactors, what an operator receives and returns",
    "populora_core.api.runview": "RunView, what every lifecycle hook receives as ``run``",
    "populora_core.api.population": "members, ratings, lineage, compute counters",
    "populora_core.api.errors": "UserError, RecipeError, PluginError",
    "populora_core.api.names": "safe names of runs, members and versions (SAFE_NAME, MEMBER_ID, check_name)",
    "populora_core.api.rng": "seeds derived from (seed, step, phase)",
    "populora_core.api.operators": "operator arity; readiness, child ratings and select, the checked way to call a "
    "selector",
    "populora_core.api.memory": "what an engine's or trainer's register(..., memory=fn) receives (PlanContext, Arch) "
    "and reports to populora plan",
    "populora_core.services": "what a plugin calls to do its work (the modules below); torch only inside functions",
    "populora_core.services.device": "where and in what dtype a base model loads (resolve_device, resolve_dtype, "
    "load_kwargs)",
    "populora_core.services.modelhost": "the process-wide shared base model that engines and trainers add adapters "
    "to (get_host)",
    "populora_core.services.adapters": "PEFT adapter directories <-> LoraWeights (and their served copies), hashes, "
    "fresh adapters, shape checks (shape_difference, check_compatible)",
    "populora_core.services.architecture": "a base model's shape from its config alone (load_arch, config_source)",
    "populora_core.services.gpu": "the visible GPU's memory, what other processes hold of it; the units of memory "
    "terms (GIB, dtype_bytes, CUDA_CONTEXT, params_text)",
    "populora_core.services.runtime": "the one owner of torch's thread count: set_torch_threads (a worker process), "
    "torch_threads (a scoped section); the runtime section's environment",
    "populora_core.services.installed": "installed versions read without importing them (version, "
    "torch_cuda_version, unchecked_vllm)",
    "populora_core.services.trainer_state": "a checkpoint's trainer state: one file per member plus a manifest",
    "populora_core.services.files": "atomic writes of a file or a folder (atomic_write_text/bytes, atomic_path, "
    "atomic_dir)",
    "populora_core.services.problems": "files of Problem records; ProblemFileEvaluator, the data an evaluator of one "
    "shipped problem file reports",
    "populora_core.services.operators": "apply_operator, the checked way to make one child",
    "populora_core.services.batching": "one call's items spread: split_by_cost (over workers), per_task (by task)",
    "populora_core.services.probe": "greedy and sampled probe accuracy of adapters on a set of problems",
    "populora_core.services.statistics": "paired intervals (cluster_bootstrap), detectable effects (cluster_mde), "
    "selection_history of a lineage",
}

__all__ = [*api.__all__, "PLUGIN_API_VERSION", "PUBLIC_MODULES", "__version__"]
