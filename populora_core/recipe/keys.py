"""The recipe reference: every key with its type, default and description (``populora keys``), and the recipe's
JSON Schema narrowed to the installed components (``populora recipe-schema``), both generated from the models."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel

from ..api.schema import LOCAL_CLUSTER, ComponentRef, Recipe
from ..plugin.registry import Registry

#: recipe sections that name a component, and its kind (``populora keys trainer`` lists the trainers)
COMPONENT_SECTIONS = {
    "base_model": "base_model",
    "tasks": "task",
    "executor": "executor",
    "engine": "engine",
    "trainer": "trainer",
    "matchmaker": "matchmaker",
    "sinks": "sink",
    "cluster": "cluster",
    "evolution.selector": "selector",
    "evolution.operators": "operator",
}


def model_keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) of every field of a params or section model, nested sections
    expanded: what ``populora keys`` prints and the recipe reference is generated from."""
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and annotation is not ComponentRef:
            rows += model_keys(annotation, f"{key}.")
            continue
        if isinstance(annotation, type) and typing.get_origin(annotation) is None:
            kind = annotation.__name__
        else:
            kind = str(annotation).replace("typing.", "").replace(f"{Recipe.__module__}.", "")
        if field.is_required():
            default = "(required)"
        else:
            value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
            dump = (
                [v.model_dump() if isinstance(v, BaseModel) else v for v in value] if isinstance(value, list) else value
            )
            default = repr(dump.model_dump() if isinstance(dump, BaseModel) else dump)
        rows.append((key, kind, default, " ".join((field.description or "").split())))
    return rows


def recipe_json_schema(registry: Registry) -> dict[str, Any]:
    """JSON Schema of a recipe, each component reference narrowed to installed names and params."""
    schema = Recipe.model_json_schema()
    defs = schema.setdefault("$defs", {})
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for comp in registry:
        params_schema = comp.params_model.model_json_schema()
        nested = params_schema.pop("$defs", {})
        defs.update(nested)
        by_kind.setdefault(comp.kind, []).append(
            {
                "type": "object",
                "title": f"{comp.kind} {comp.name} ({comp.plugin})",
                "properties": {
                    "name": {"const": comp.name},
                    "params": params_schema,
                    **({"weight": {"type": "number"}} if comp.kind == "operator" else {}),
                },
                "required": ["name"],
                "additionalProperties": False,
            }
        )
    fields = {
        "executor": "executor",
        "engine": "engine",
        "trainer": "trainer",
        "matchmaker": "matchmaker",
        "cluster": "cluster",
    }
    props = schema["properties"]
    local = {
        "type": "object",
        "title": "cluster local (built in)",
        "properties": {"name": {"const": LOCAL_CLUSTER}, "params": {"type": "object", "maxProperties": 0}},
        "required": ["name"],
        "additionalProperties": False,
    }
    by_kind["cluster"] = [local, *by_kind.get("cluster", [])]
    for field_name, kind in fields.items():
        if by_kind.get(kind):
            props[field_name] = {
                "anyOf": [
                    *by_kind[kind],
                    {"type": "string", "enum": [o["properties"]["name"]["const"] for o in by_kind[kind]]},
                ]
            }
    for field_name, kind in (("tasks", "task"), ("sinks", "sink")):
        if by_kind.get(kind):
            names = [o["properties"]["name"]["const"] for o in by_kind[kind]]
            props[field_name] = {
                "type": "array",
                "items": {"anyOf": [*by_kind[kind], {"type": "string", "enum": names}]},
            }
    schema["x-populora-components"] = {
        kind: {o["properties"]["name"]["const"]: o["properties"]["params"] for o in items}
        for kind, items in by_kind.items()
    }
    return schema


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown_table(rows: list[tuple[str, str, str, str]]) -> list[str]:
    lines = ["| key | type | default | what it does |", "| --- | --- | --- | --- |"]
    return lines + [
        f"| `{key}` | {_cell(kind)} | `{_cell(default)}` | {_cell(text)} |" for key, kind, default, text in rows
    ]


def reference_markdown(registry: Registry, plugins: set[str] | None = None) -> str:
    """Every recipe key and every component's params as one Markdown page (``docs/recipe-keys.md`` holds the
    built-in plugins' page; ``populora keys --markdown`` prints the installed ones'). ``plugins``: only the
    components of these plugins (None: all)."""
    lines = [
        "# Recipe keys",
        "",
        "Generated from the params models by `python -m populora_core.recipe.keys` (a test keeps it current);",
        "`populora keys [SECTION|COMPONENT]` prints the same for what is installed. A key is overridden on the",
        "command line as `key.sub=value` (list items by index: `evolution.operators.0.name=svd`).",
        "",
        "## Sections",
        "",
        *_markdown_table(model_keys(Recipe)),
    ]
    for section, kind in COMPONENT_SECTIONS.items():
        components = sorted(
            (c for c in registry if c.kind == kind and (plugins is None or c.plugin in plugins)), key=lambda c: c.name
        )
        if not components:
            continue
        lines += ["", f"## `{section}`: {kind} components", ""]
        for component in components:
            lines += ["", f"### `{component.name}` (plugin {component.plugin})", ""]
            lines += [component.description, ""] if component.description else []
            rows = model_keys(component.params_model, f"{section}.params.")
            lines += _markdown_table(rows) if rows else ["No params."]
    return "\n".join(lines) + "\n"


def builtin_plugins() -> set[str]:
    """The plugins this toolkit ships: its own distribution's ``populora`` entry points."""
    from importlib.metadata import distribution

    return {ep.name for ep in distribution("populora-toolkit").entry_points if ep.group == "populora"}


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from ..plugin.manager import get_manager

    target = Path(__file__).resolve().parents[2] / "docs" / "recipe-keys.md"
    target.write_text(reference_markdown(get_manager().registry, builtin_plugins()))
    print(f"wrote {target}", file=sys.stderr)
