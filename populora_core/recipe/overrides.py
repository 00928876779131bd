"""Reading a recipe file: YAML in which a key given twice is an error, and ``key=value`` overrides on top."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel

from ..api.errors import RecipeError
from .shipped import resolve_recipe


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (PyYAML keeps the last
    silently, so a recipe's second ``lr:`` would quietly win over the first)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"key {key!r} appears twice in one mapping (lines {seen[key]} and {key_node.start_mark.line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A recipe file, or the shipped recipe of that name (``nano``): :func:`.shipped.resolve_recipe`."""
    file = resolve_recipe(path)
    try:
        data = yaml.load(file.read_text(), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise RecipeError(f"not valid YAML: {exc}", recipe=str(file)) from None
    if not isinstance(data, dict):
        raise RecipeError("a recipe is a YAML mapping at the top level", recipe=str(file))
    return data


def _parsed(item: str, recipe: str | None) -> tuple[str, Any]:
    """(key, value) of one ``a.b.c=value`` override, the value parsed as YAML."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise RecipeError(f"override {item!r} is not key.sub=value", recipe=recipe)
    return key, yaml.load(raw, Loader=_UniqueKeyLoader) if raw != "" else ""


def apply_overrides(
    data: dict[str, Any], overrides: list[str] | tuple[str, ...], recipe: str | None = None
) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML; list items by index)."""
    result = copy.deepcopy(data)
    for item in overrides:
        key, value = _parsed(item, recipe)
        node: Any = result
        parts = key.split(".")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise RecipeError(
                        f"override {item!r}: no list item {part!r}", recipe=recipe, path=".".join(parts[: i + 1])
                    )
                if last:
                    node[int(part)] = value
                else:
                    node = node[int(part)]
                continue
            if not isinstance(node, dict):
                raise RecipeError(f"override {item!r}: {'.'.join(parts[:i])} is not a mapping", recipe=recipe)
            if isinstance(node.get(part), str) and not last:  # `engine: hf` then `engine.params.x=1`
                node[part] = {"name": node[part]}
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
    return result


ModelT = TypeVar("ModelT", bound=BaseModel)


def override_model(model: ModelT, overrides: Sequence[str]) -> ModelT:
    """A typed recipe (or section) with ``a.b.c=value`` overrides, as the command line writes them: every model on a
    key's path is validated again with the fields it had set and the new value (what it left to defaults stays
    so), a mapping's entry or a list's item replaced; a set field the overrides do not reach is the same object."""
    for item in overrides:
        key, value = _parsed(item, None)
        model = _replaced(model, key.split("."), value)
    return model


def _replaced(node: Any, parts: list[str], value: Any) -> Any:
    head, rest = parts[0], parts[1:]
    if isinstance(node, BaseModel):
        fields = {name: getattr(node, name) for name in node.model_fields_set}
        fields[head] = _replaced(getattr(node, head, None), rest, value) if rest else value
        return type(node).model_validate(fields)
    if isinstance(node, list):
        if not head.isdigit() or int(head) >= len(node):
            raise RecipeError(f"override {'.'.join(parts)}={value!r}: no list item {head!r}")
        items = list(node)
        items[int(head)] = _replaced(node[int(head)], rest, value) if rest else value
        return items
    mapping = dict(node or {})
    mapping[head] = _replaced(mapping.get(head), rest, value) if rest else value
    return mapping
