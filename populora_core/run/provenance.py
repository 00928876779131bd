"""Which plugin, package and version supplied each component of a run: ``RUN/components.json`` and a ``run.log``
line at every start and resume. A run's results depend on its plugins' code; and when a resume cannot find a
component (its plugin was uninstalled), the record names what to reinstall."""

from __future__ import annotations

import json
from typing import Any

from ..api.errors import RecipeError
from ..api.schema import Recipe
from ..services.files import atomic_write_text
from .run_dir import RunDir

FILE = "components.json"


def component_sources(recipe: Recipe, manager: Any) -> list[dict[str, Any]]:
    """One record per component the recipe names: YAML path, kind, name, plugin, package and its version."""
    rows = []
    for path, kind, ref in recipe.component_refs():
        row: dict[str, Any] = {"path": path, "kind": kind, "name": ref.name}
        if kind == "base_model" and ref.name not in manager.registry.names("base_model"):
            row.update(plugin=None, package=None, version=None)  # a hub id or a local folder: no plugin
        else:
            component = manager.registry.get(kind, ref.name)
            info = manager.plugins.get(component.plugin)
            row.update(
                plugin=component.plugin,
                package=info.source if info is not None else None,
                version=info.version if info is not None else component.version,
            )
        rows.append(row)
    return rows


def describe(rows: list[dict[str, Any]]) -> str:
    """The run.log line: ``trainer trr++ (trainers: populora-toolkit 0.1.0), ...``."""
    parts = []
    for row in rows:
        origin = f"{row['plugin']}: {row['package']} {row['version']}" if row["plugin"] else "no plugin"
        parts.append(f"{row['kind']} {row['name']} ({origin})")
    return "components: " + ", ".join(parts)


def record_sources(recipe: Recipe, run_dir: RunDir, manager: Any) -> str:
    """Write ``RUN/components.json`` (this session's sources); returns the line for ``run.log``."""
    rows = component_sources(recipe, manager)
    atomic_write_text(run_dir.path / FILE, json.dumps(rows, indent=1) + "\n")
    return describe(rows)


def missing_plugin(exc: RecipeError, run_dir: RunDir) -> RecipeError:
    """A resume's error for a component no installed plugin registers, naming the plugin and package that
    supplied it when the run was made (``RUN/components.json``); the error unchanged when nothing is recorded."""
    try:
        rows = json.loads((run_dir.path / FILE).read_text())
    except (OSError, ValueError):
        return exc
    path = (exc.path or "").removesuffix(".name")
    row = next((r for r in rows if isinstance(r, dict) and r.get("path") == path and r.get("plugin")), None)
    if row is None or "unknown" not in exc.detail:
        return exc
    detail = (
        f"{exc.detail}; this run's {row['kind']} {row['name']!r} came from plugin {row['plugin']} (package "
        f"{row['package']} {row['version']}), which is not installed or did not load now: reinstall it to resume "
        "(`populora plugins` lists what loaded)"
    )
    return RecipeError(detail, recipe=exc.recipe, path=exc.path, component=exc.component, plugin=exc.plugin)
