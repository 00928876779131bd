"""Component registry: kind -> name -> (factory, params model, providing plugin, version).

Plugins never write to the registry directly: the core calls each ``register_<kind>s(register)``
hookimpl with a ``register`` callback bound to that plugin, so the core owns names, collisions and
provenance (the simonw/llm pattern).
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Unpack

from pydantic import BaseModel, TypeAdapter, ValidationError

from ..api import components
from ..api.errors import PluginError, UserError
from ..api.operators import operator_arity
from ..api.params import Component, Meta, NoParams, Params, _first_line

#: Component kinds, their ``register_*`` hook and what the registered factory is called with.
KINDS: dict[str, str] = {
    "task": "register_tasks",
    "executor": "register_executors",
    "trainer": "register_trainers",
    "engine": "register_engines",
    "matchmaker": "register_matchmakers",
    "selector": "register_selectors",
    "operator": "register_operators",
    "evaluator": "register_evaluators",
    "base_model": "register_base_models",
    "sink": "register_sinks",
    "cluster": "register_clusters",
}

#: The keywords (:class:`populora_core.api.params.Meta`) a ``register`` call of each kind may pass besides name,
#: factory, params and description; ``doctor`` any kind.
KEYWORDS: dict[str, frozenset[str]] = {kind: frozenset({"doctor"}) for kind in KINDS} | {
    "engine": frozenset({"doctor", "memory"}),
    "trainer": frozenset({"doctor", "memory", "sampling_logprobs"}),
    "cluster": frozenset({"doctor", "gpus"}),
    "operator": frozenset({"doctor", "min_parents", "max_parents"}),
    "evaluator": frozenset({"doctor", "category"}),
}
_META = TypeAdapter(Meta)


def checked_meta(kind: str, meta: dict[str, Any], where: str) -> Meta:
    """``meta`` as a :class:`Meta` of ``kind``: an unknown keyword (a misspelt ``min_parent``) or a value of another
    type is a :class:`PluginError` naming ``where`` (the plugin and component) and the keyword, at load."""
    allowed = sorted(KEYWORDS[kind])
    for key in meta:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise PluginError(
                f"{where}: register() got the unknown keyword {key!r}{hint}; {kind}s take {', '.join(allowed)} "
                "besides name, factory, params and description"
            )
    try:
        return _META.validate_python(meta, strict=True)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(part) for part in first["loc"][:1])
        raise PluginError(f"{where}: register({key}=...): {first['msg']}") from None


class Registry:
    """Components by kind and name, with the plugin that provided each."""

    def __init__(self) -> None:
        self._items: dict[str, dict[str, Component]] = {kind: {} for kind in KINDS}

    def bind(self, kind: str, plugin: str, version: str) -> Callable[..., None]:
        """The ``register`` callback handed to one plugin's ``register_<kind>s`` hookimpl."""

        def register(
            name: str,
            factory: Callable[..., Any],
            params: type[Params] = NoParams,
            description: str = "",
            **meta: Unpack[Meta],
        ) -> None:
            checked = checked_meta(kind, dict(meta), f"plugin {plugin}: {kind} {name!r}")
            component = Component(
                kind, name, factory, params, plugin, version, description or _first_line(factory.__doc__), checked
            )
            if kind == "operator":
                operator_arity(component)  # declared, and a possible count: checked now, not at first use
            self.add(component)

        keywords = ", ".join(f"{k}=" for k in sorted(KEYWORDS[kind]))
        register.__doc__ = (
            f"Register a {kind} component: register(name, factory, params=Params, description='', {keywords}...)."
        )
        return register

    def add(self, component: Component) -> None:
        if component.kind not in KINDS:
            raise PluginError(f"unknown component kind {component.kind!r}")
        if not (isinstance(component.params_model, type) and issubclass(component.params_model, BaseModel)):
            raise PluginError(
                f"{component.kind} {component.name!r} from plugin {component.plugin}: "
                "params must be a pydantic model class"
            )
        existing = self._items[component.kind].get(component.name)
        if existing is not None:
            raise PluginError(
                f"{component.kind} name {component.name!r} is registered twice: by plugin "
                f"{existing.plugin} and by plugin {component.plugin}"
            )
        self._items[component.kind][component.name] = component

    def remove_plugin(self, plugin: str) -> None:
        """Drop everything one plugin registered (used when its registration fails midway)."""
        for kind in self._items.values():
            for name in [n for n, c in kind.items() if c.plugin == plugin]:
                del kind[name]

    def get(self, kind: str, name: str) -> Component:
        """Look a component up by name, or by ``package.module:attr`` for an unregistered one."""
        if kind not in KINDS:
            raise UserError(f"unknown component kind {kind!r}")
        found = self._items[kind].get(name)
        if found is not None:
            return found
        if ":" in name:
            return _import_component(kind, name)
        known = ", ".join(sorted(self._items[kind])) or "none installed"
        raise UserError(f"unknown {kind} {name!r} (known: {known})")

    def names(self, kind: str) -> list[str]:
        return sorted(self._items[kind])

    def base_model(self, name: str, params: dict[str, Any] | None = None) -> components.BaseModel:
        """A registered short name (``nano``) through its plugin; else a local model directory or a hub id."""
        registered = self._items["base_model"].get(name)
        if registered is not None:
            model = registered.build(params)
            if not isinstance(model, components.BaseModel):
                raise PluginError(f"base model {name!r} (plugin {registered.plugin}) must return components.BaseModel")
            return model
        if params:
            raise UserError(f"base model {name!r}: params are only accepted for a registered base model")
        path = Path(name).expanduser()
        if path.exists():
            if not (path / "config.json").is_file():
                raise UserError(f"base model directory {path} has no config.json")
            return components.BaseModel(path=str(path), name=name)
        return components.BaseModel(path=hub_snapshot(name), name=name)

    def __iter__(self) -> Iterator[Component]:
        for kind in KINDS:
            yield from (self._items[kind][n] for n in sorted(self._items[kind]))


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def hub_snapshot(repo_id: str) -> str:
    """The local directory of a hub model, from the Hugging Face cache (downloaded unless HF_HUB_OFFLINE=1)."""
    if not _HUB_ID.match(repo_id) or ".." in repo_id:
        raise UserError(f"base model {repo_id!r}: no such directory, and not a hub id (org/name)")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = bool(constants.HF_HUB_OFFLINE)
    try:
        return str(snapshot_download(repo_id, local_files_only=offline))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as exc:
        where = f"the Hugging Face cache {constants.HF_HUB_CACHE}"
        how = "offline (HF_HUB_OFFLINE=1): fetch it once with `hf download " + repo_id + "` (huggingface_hub's CLI) or"
        raise UserError(
            f"base model {repo_id!r} not found in {where}"
            + (f" {how} name a local directory" if offline else f" and not downloadable ({type(exc).__name__})")
        ) from None


def _import_component(kind: str, ref: str) -> Component:
    """A recipe may name ``package.module:attr``: a factory, optionally with a ``Params`` attribute."""
    module_name, _, attr = ref.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"cannot import {kind} {ref!r}: {exc}") from None
    params = getattr(target, "Params", NoParams)
    return Component(
        kind,
        ref,
        target,
        params,
        plugin=module_name,
        version="local",
        description=_first_line(getattr(target, "__doc__", None)),
    )
