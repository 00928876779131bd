"""The plugin API: everything a plugin may import from the core, and nothing above it.

This is the bottom floor of the core (``api`` < ``plugin`` < ``recipe`` < ``run`` < ``cli``): its modules import
only each other, so a plugin that imports ``populora_core.api`` and its submodules depends on no part of the loop,
the recipe reader or the CLI (``tests/core/test_import_rules.py`` enforces both). :data:`populora_core.PUBLIC_MODULES`
says what each module is for. Nothing here imports torch.

The names below are the ones plugins used from the top-level ``populora_core`` (which still exports them):
``hookimpl``, the params base classes, the errors, :func:`get_registry` and :func:`build_engine`. The last two
reach the upper floors, so they import them inside the call, never when this package is imported.
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
    from ..run.assembly import build_engine as build

    return build(name, params, **context)
