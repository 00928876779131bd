"""The plugin API's contracts: what a plugin implements or receives, and nothing above it.

This is the bottom floor of the core (``api`` < ``services`` < ``plugin`` < ``recipe`` < ``run`` < ``cli``): its
modules import only each other, and never torch, transformers or peft, not even inside a function, so reading a
contract costs nothing. What a plugin calls to do its work (the shared base model, adapter files, atomic writes,
the probe, statistics, torch's threads) is the floor above, :mod:`populora_core.services`.
:data:`populora_core.PUBLIC_MODULES` says what each module of both is for (``tests/core/test_import_rules.py``
enforces the floors and the no-torch rule).

The names below are the package's own: ``hookimpl``, the params base classes, the errors, :func:`get_registry` and
:func:`build_engine` (``populora_core`` re-exports this list). The last two reach the upper floors, so they import
them inside the call, never when this package is imported.
"""

from typing import Any

from .errors import PluginError, PopuloraError, RecipeError, UserError
from .hooks import hookimpl
from .params import Component, NoParams, Params, format_validation_error

__all__ = [
    "Component",
    "NoParams",
    "Params",
    "PluginError",
    "PopuloraError",
    "RecipeError",
    "UserError",
    "build_engine",
    "format_validation_error",
    "get_registry",
    "hookimpl",
]


def get_registry(plugin_files: tuple[str, ...] | list[str] = ()) -> Any:
    """The registry of every installed plugin's components (loaded once per process): ``.get(kind, name)`` a
    :class:`Component`, ``.names(kind)`` the registered names. ``plugin_files``: extra plugin files to load."""
    from ..plugin.manager import get_registry as registry

    return registry(plugin_files)


def build_engine(name: str, params: Any, **context: Any) -> Any:
    """Engine ``name`` built outside a run (``populora eval``, a benchmark): on a GPU its ``auto`` settings chosen by
    a plan of the engine alone there. Keywords: ``who`` (the builder, named in its log line and errors),
    ``base_model``, ``lora``, ``seed``, ``log`` (a callable for the choice), and the engine's own context."""
    from ..run.assembly import plan_and_build_engine

    return plan_and_build_engine(name, params, **context)
