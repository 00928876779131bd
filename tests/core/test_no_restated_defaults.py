"""One recipe path: plugins read the typed, defaulted recipe and their parsed params model, never a raw section with
a default of their own (``rollout.get("solver_samples", 8)`` drifts the day the schema's default changes)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import BaseModel

from populora_core.api import schema
from populora_core.plugin.manager import get_manager

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


def _defaulted(model: type[BaseModel]) -> set[str]:
    return {name for name, f in model.model_fields.items() if not f.is_required()}


def defaults_by_receiver() -> dict[str, set[str]]:
    """Which keys have a default, by the name a plugin gives what it reads: the recipe, each of its sections (by
    the section's key) and a component's params (every registered params model)."""
    sections: dict[str, set[str]] = {"recipe": _defaulted(schema.Recipe)}
    for key, f in schema.Recipe.model_fields.items():
        model = f.annotation if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel) else None
        sections[key] = _defaulted(model) if model else set()
    models = [schema.ComponentRef] + [c.params_model for c in get_manager().registry if c.params_model is not None]
    params = set().union(*map(_defaulted, models))
    return sections | {"params": params, "raw": params, "section": params}


def receiver(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)  # recipe["rollout"].get(...)
    return None


def restated_defaults(source: str, defaults: dict[str, set[str]]) -> list[tuple[int, str]]:
    """(line, call) of each ``<recipe, section or params>.get("<key with a default>", default)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"):
            continue
        key = node.args[0] if node.args else None
        has_default = len(node.args) == 2 or any(k.arg == "default" for k in node.keywords)
        keys = defaults.get(receiver(node.func.value) or "", set())
        if has_default and isinstance(key, ast.Constant) and key.value in keys:
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


@pytest.mark.parametrize("file", sorted(PLUGINS.rglob("*.py")), ids=lambda p: str(p.relative_to(PLUGINS)))
def test_no_plugin_restates_a_recipe_default(file):
    found = restated_defaults(file.read_text(), defaults_by_receiver())
    assert not found, "\n".join(
        f"{file.relative_to(PLUGINS)}:{line}: {call} restates a default; read the typed recipe or params model"
        for line, call in found
    )


def test_a_restated_default_is_caught_with_its_line():
    source = (
        "def memory(recipe, params):\n"
        "    samples = recipe['rollout'].get('solver_samples', 8)\n"
        "    rank = recipe.get('lora', {}).get('rank', 16)\n"
        "    mode = population.get('mode', 'population')\n"
        "    engine = registry.get('engine', 'hf')\n"  # a registry lookup, not a recipe read
        "    step = rec.get('step', 0)\n"  # a log record, not the recipe
        "    name = recipe.get('name', 'run')\n"  # the recipe's name has no default to restate
        "    timeout = params.get('timeout_s', 5)\n"
    )
    assert [line for line, _ in restated_defaults(source, defaults_by_receiver())] == [2, 3, 4, 8]
