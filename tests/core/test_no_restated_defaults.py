"""One recipe path: plugins read the typed, defaulted recipe and their parsed params model, never a raw section with
a default of their own (``rollout.get("solver_samples", 8)`` drifts the day the schema's default changes), never an
attribute with a fallback (``getattr(params, "mu", 25.0)``), and no helper's signature copies its plugin's params
default (``def advantages(rollouts, normalize: str = "token")``): the params model is passed whole, or the value
without a default."""

from __future__ import annotations

import ast
import functools
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from populora_core.api import schema
from populora_core.plugin.manager import get_manager

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


@dataclass
class Defaults:
    """What a plugin could restate: ``by_receiver`` (the keys with a default, by the name a plugin gives what it
    reads: the recipe, each of its sections, a component's params) for ``.get``; ``fields`` (every defaulted field
    of the recipe's sections and the registered params models) for ``getattr``; ``own`` (each field's defaults in
    the file's own plugin's params models) for signatures."""

    by_receiver: dict[str, set[str]]
    fields: set[str]
    own: dict[str, list[Any]] = field(default_factory=dict)


def _defaulted(model: type[BaseModel]) -> set[str]:
    return {name for name, f in model.model_fields.items() if not f.is_required()}


def _section_models() -> dict[str, type[BaseModel]]:
    return {
        key: f.annotation
        for key, f in schema.Recipe.model_fields.items()
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)
    }


def _default_values(models: list[type[BaseModel]]) -> dict[str, list[Any]]:
    """Each field's plain defaults (None, a default factory: nothing a signature could copy)."""
    values: dict[str, list[Any]] = {}
    for model in models:
        for name, f in model.model_fields.items():
            if not f.is_required() and f.default_factory is None and f.default is not None:
                values.setdefault(name, []).append(f.default)
    return values


@functools.cache
def _registered() -> dict[str, list[type[BaseModel]]]:
    """Every registered params model, by the package of the plugin that registered it."""
    manager = get_manager()
    models: dict[str, list[type[BaseModel]]] = {}
    for c in manager.registry:
        package = getattr(manager.pm.get_plugin(c.plugin), "__name__", c.plugin).split(".")[0]
        models.setdefault(package, []).append(c.params_model)
    return models


def plugin_defaults(package: str) -> Defaults:
    """The defaults of the installed recipe schema and plugins, for a file of ``package``."""
    sections: dict[str, set[str]] = {"recipe": _defaulted(schema.Recipe)}
    sections |= {key: set() for key in schema.Recipe.model_fields}
    sections |= {key: _defaulted(model) for key, model in _section_models().items()}
    models = [schema.ComponentRef, *(m for ms in _registered().values() for m in ms)]
    params = set().union(*map(_defaulted, models))
    fields = params.union(*sections.values())
    by_receiver = sections | {"params": params, "raw": params, "section": params}
    return Defaults(by_receiver, fields, _default_values(_registered().get(package, [])))


_OPERATORS: dict[type, Any] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.USub: operator.neg, ast.UAdd: operator.pos,
}  # fmt: skip


def _literal(node: ast.expr) -> Any:
    """The value of a literal or an arithmetic of literals, computed here (never ``eval``); ValueError otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple | ast.List):
        values = [_literal(e) for e in node.elts]
        return values if isinstance(node, ast.List) else tuple(values)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_literal(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_literal(node.left), _literal(node.right))
    raise ValueError(ast.dump(node))


def constant(node: ast.expr) -> tuple[Any] | None:
    """``(value,)`` of a literal or an arithmetic of literals (``25 / 3``), else None."""
    try:
        return (_literal(node),)
    except (ValueError, ArithmeticError):
        return None


def _same(a: Any, b: Any) -> bool:
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return a == b
    return type(a) is type(b) and a == b


def receiver(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)  # recipe["rollout"].get(...)
    return None


def _restated_get(node: ast.Call, defaults: Defaults) -> bool:
    """``<recipe, section or params>.get("<key with a default>", default)``."""
    if not (isinstance(node.func, ast.Attribute) and node.func.attr == "get"):
        return False
    key = node.args[0] if node.args else None
    has_default = len(node.args) == 2 or any(k.arg == "default" for k in node.keywords)
    keys = defaults.by_receiver.get(receiver(node.func.value) or "", set())
    return has_default and isinstance(key, ast.Constant) and key.value in keys


def _restated_getattr(node: ast.Call, defaults: Defaults) -> bool:
    """``getattr(obj, "<a defaulted field>", <literal>)``; a None fallback asks whether the attribute is there."""
    if not (isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) == 3):
        return False
    name, fallback = node.args[1], constant(node.args[2])
    return isinstance(name, ast.Constant) and name.value in defaults.fields and fallback not in (None, (None,))


def _copied_signature_defaults(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, defaults: Defaults):
    """Each parameter (positional or keyword-only) whose default is its plugin's params default of that name."""
    args = node.args
    positional = args.posonlyargs + args.args
    pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    for arg, default in pairs:
        value = constant(default)
        if value is not None and any(_same(value[0], v) for v in defaults.own.get(arg.arg, [])):
            yield default.lineno, f"{arg.arg}={ast.unparse(default)}"


def restated_defaults(source: str, defaults: Defaults) -> list[tuple[int, str]]:
    """(line, code) of each restated default in ``source``: a ``.get`` or ``getattr`` fallback of a defaulted key,
    a signature default copied from the file's plugin's params model."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and (_restated_get(node, defaults) or _restated_getattr(node, defaults)):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            found += _copied_signature_defaults(node, defaults)
    return sorted(found)


@pytest.mark.parametrize("file", sorted(PLUGINS.rglob("*.py")), ids=lambda p: str(p.relative_to(PLUGINS)))
def test_no_plugin_restates_a_recipe_default(file):
    found = restated_defaults(file.read_text(), plugin_defaults(file.relative_to(PLUGINS).parts[0]))
    assert not found, "\n".join(
        f"{file.relative_to(PLUGINS)}:{line}: {code} restates a default; read the typed recipe or params model"
        for line, code in found
    )


def test_a_restated_get_is_caught_with_its_line():
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
    assert [line for line, _ in restated_defaults(source, plugin_defaults("populora_azr"))] == [2, 3, 4, 8]


def test_a_getattr_fallback_and_a_copied_signature_default_are_caught_with_their_lines():
    """Each form planted beside what looks like it and is not: the params model is synthetic, so the test does not
    depend on the installed plugins' defaults."""

    class Planted(BaseModel):
        mu: float = 25.0
        sigma: float = 25.0 / 3.0
        normalize: str = "token"
        lr: float = 1e-5
        workers: int | None = None

    defaults = Defaults({"params": _defaulted(Planted)}, _defaulted(Planted), _default_values([Planted]))
    source = (
        "def rate(p, built, module):\n"
        "    mu = getattr(p, 'mu', 25.0)\n"  # a fallback of a defaulted field
        "    sigma = getattr(p, 'sigma', 25 / 3)\n"  # an arithmetic of literals
        "    seeded = getattr(built, 'row_seeded', False)\n"  # no params field of that name
        "    workers = getattr(p, 'workers', None)\n"  # a None fallback: is the attribute there?
        "    needs = getattr(module, 'PLUGIN_REQUIRES', ())\n"
        "    return getattr(p, 'mu')\n"  # no fallback
        "def advantages(rollouts, normalize: str = 'token', eps: float = 1e-8):\n"  # normalize copies the model
        "    return rollouts\n"
        "def step(weights, *, lr: float = 1e-5, lr_b: float = 1e-5, sigma: float = 2.0):\n"  # lr copies it
        "    return weights\n"
        "scale = lambda w, normalize='sequence': w\n"  # not the model's default: a choice of its own
    )
    assert restated_defaults(source, defaults) == [
        (2, "getattr(p, 'mu', 25.0)"),
        (3, "getattr(p, 'sigma', 25 / 3)"),
        (8, "normalize='token'"),
        (10, "lr=1e-05"),
    ]
