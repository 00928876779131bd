"""Plugin manager: entry points loaded one by one, a table of failures, local plugin files.

Built-in plugins register through the same ``populora`` entry-point group a third-party package
uses. A plugin that fails to import or register becomes a warning and a row in ``populora plugins``;
``POPULORA_STRICT_PLUGINS=1`` turns that into an error. ``POPULORA_LOAD_PLUGINS=a,b`` loads only
the named entry points, ``POPULORA_DISABLE_PLUGINS=c`` blocks some.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from ..api.errors import PluginError, UserError
from . import hookspecs
from .registry import KINDS, Registry

ENTRY_POINT_GROUP = "populora"


class PluginLoadWarning(UserWarning):
    """A plugin failed to import or register and was disabled."""


@dataclass
class PluginInfo:
    """One plugin as ``populora plugins`` shows it."""

    name: str
    source: str  # distribution name, or the file path of a --plugin file
    version: str
    hooks: list[str]
    error: str | None = None


class PluginManager:
    """pluggy's manager plus the component registry and the table of plugin failures."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("populora")
        self.pm.add_hookspecs(hookspecs)
        self.registry = Registry()
        self.plugins: dict[str, PluginInfo] = {}

    @property
    def hook(self) -> Any:
        return self.pm.hook

    # --- loading ------------------------------------------------------------------------------

    def load_entry_points(self) -> None:
        """Load every entry point of the ``populora`` group, each on its own, honouring the env vars."""
        only = _env_list("POPULORA_LOAD_PLUGINS")
        disabled = set(_env_list("POPULORA_DISABLE_PLUGINS") or [])
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if (only is not None and ep.name not in only) or ep.name in disabled:
                self.pm.set_blocked(ep.name)
                continue
            if self.pm.has_plugin(ep.name):
                continue
            dist = ep.dist
            source = dist.metadata["Name"] if dist is not None else "?"
            version = dist.version if dist is not None else "?"
            try:
                module = ep.load()
            except Exception as exc:  # a broken third-party plugin must not kill the CLI
                self._failed(ep.name, source, version, f"import failed: {type(exc).__name__}: {exc}")
                continue
            self.add_plugin(module, ep.name, source=source, version=version)
        self._disable_missing_requirements()

    def load_file(self, path: str | os.PathLike[str]) -> None:
        """Load a local, unpackaged plugin file (``--plugin path.py``) for this process."""
        file = Path(path).absolute()  # a cluster's workers, elsewhere, load the same path
        if not file.is_file():
            raise UserError(f"plugin file not found: {file}")
        name = f"file:{file.stem}"
        spec = importlib.util.spec_from_file_location(f"populora_local_plugin_{file.stem}", file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        # registered before it runs, as an import would: a dataclass (a task's problem type) looks its module up,
        # and pickles of its objects (a task's checkpointed buffer) name it
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[spec.name]
            raise UserError(f"plugin file {file} failed to import: {type(exc).__name__}: {exc}") from None
        # a file the user names on the command line is meant to act: a misspelled hook or a wrong signature is an
        # error (exit 2), not the warning an installed plugin gets, or the run would start without it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PluginLoadWarning)
            loaded = self.add_plugin(module, name, source=str(file), version="local")
        if not loaded:
            hooks = [h for h in dir(self.pm.hook) if getattr(getattr(self.pm.hook, h), "spec", None) is not None]
            hints = [
                f"{attr} -> did you mean {close[0]}?"
                for attr in dir(module)
                if hasattr(getattr(module, attr), "populora_impl") and attr not in hooks
                for close in [difflib.get_close_matches(attr, hooks, n=1)]
                if close
            ]
            hint = f" ({'; '.join(hints)})" if hints else ""
            error = " ".join(str(self.plugins.pop(name).error).split())  # pluggy's message spans lines
            raise UserError(f"plugin file {file}: {error}{hint}")

    def add_plugin(
        self, plugin: ModuleType | object, name: str, *, source: str = "local", version: str = "local"
    ) -> bool:
        """Register one plugin object and run its ``register_*`` hooks; False (and a row) on failure."""
        try:
            self.pm.register(plugin, name=name)
        except Exception as exc:
            if self.pm.is_registered(plugin):  # a historic hook's replay (register_commands) raised in it
                self.pm.unregister(plugin)
            self._failed(name, source, version, f"register failed: {type(exc).__name__}: {exc}")
            return False
        try:
            self._collect(name, version)
            self.pm.check_pending()
        except Exception as exc:
            self.pm.unregister(name=name)
            self.registry.remove_plugin(name)
            self._failed(name, source, version, f"{type(exc).__name__}: {exc}")
            return False
        hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])
        self.plugins[name] = PluginInfo(name, source, version, hooks)
        return True

    def _collect(self, name: str, version: str) -> None:
        """Call this plugin's register_* hookimpls with a register callback bound to it."""
        for kind, hook_name in KINDS.items():
            caller = getattr(self.pm.hook, hook_name)
            for impl in caller.get_hookimpls():
                if impl.plugin_name == name:
                    impl.function(register=self.registry.bind(kind, name, version))

    def _disable_missing_requirements(self) -> None:
        """A plugin whose ``PLUGIN_REQUIRES`` names a package that no loaded plugin provides is disabled."""
        changed = True
        while changed:  # disabling one may strand another that needs it
            changed = False
            loaded = {getattr(self.pm.get_plugin(n), "__name__", n) for n, i in self.plugins.items() if not i.error}
            for name, info in list(self.plugins.items()):
                module = self.pm.get_plugin(name)
                missing = [r for r in getattr(module, "PLUGIN_REQUIRES", ()) if r not in loaded]
                if info.error or not missing:
                    continue
                self.pm.unregister(name=name)
                self.registry.remove_plugin(name)
                self._failed(
                    name, info.source, info.version, f"needs plugin package(s) {', '.join(missing)}, not loaded"
                )
                changed = True

    def _failed(self, name: str, source: str, version: str, error: str) -> None:
        if os.environ.get("POPULORA_STRICT_PLUGINS") == "1":
            raise PluginError(f"plugin {name} ({source}): {error}")
        warnings.warn(f"populora: plugin {name} ({source}) disabled: {error}", PluginLoadWarning, stacklevel=3)
        self.plugins[name] = PluginInfo(name, source, version, [], error)

    # --- queries ------------------------------------------------------------------------------

    @property
    def plugin_files(self) -> list[str]:
        """The ``--plugin`` files loaded here (absolute paths): what a cluster's workers must load as well."""
        return [info.source for name, info in self.plugins.items() if name.startswith("file:")]

    def hook_names(self) -> list[str]:
        return sorted(n for n in dir(hookspecs) if hasattr(getattr(hookspecs, n), "populora_spec"))


def _env_list(var: str) -> list[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return [p.strip() for p in raw.split(",") if p.strip()]


_manager: PluginManager | None = None


def get_manager(plugin_files: tuple[str, ...] | list[str] = ()) -> PluginManager:
    """The process-wide plugin manager, entry points loaded on first use, plus ``plugin_files``."""
    global _manager
    if _manager is None:
        _manager = PluginManager()
        _manager.load_entry_points()
    for file in plugin_files:
        if f"file:{Path(file).stem}" not in _manager.plugins:
            _manager.load_file(file)
    return _manager


def reset_manager() -> None:
    """Forget the process-wide manager (tests; a new environment of plugins)."""
    global _manager
    _manager = None
    for mod in [m for m in sys.modules if m.startswith("populora_local_plugin_")]:
        del sys.modules[mod]


def get_registry(plugin_files: tuple[str, ...] | list[str] = ()) -> Registry:
    """The components of every installed plugin (and ``plugin_files``): the one public way to look one up.

    ``get_registry().get("engine", "hf").build({"device": "cpu"}, base_model=..., lora=..., seed=0)``.
    """
    return get_manager(plugin_files).registry
