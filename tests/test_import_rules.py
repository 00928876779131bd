"""Plugins import only the core's public modules and the plugins they declare in ``PLUGIN_REQUIRES``."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import fields
from pathlib import Path

import pytest

import populora_core
from populora_core.api.runview import RunView

PLUGINS = Path(__file__).resolve().parent.parent / "plugins"


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) of every absolute import; ``from pkg import sub`` counts ``pkg.sub`` when it is a module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            subs = [f"{node.module}.{alias.name}" for alias in node.names]
            found += [(node.lineno, sub) for sub in subs if _is_module(sub)]
    return found


def violations(package: Path, plugins_dir: Path = PLUGINS) -> list[str]:
    """Imports in one plugin package of a private core module or of a plugin it does not declare."""
    own = package.name
    declared = set(getattr(importlib.import_module(own), "PLUGIN_REQUIRES", ()))
    plugins = {p.name for p in plugins_dir.iterdir() if (p / "__init__.py").is_file()}
    bad = []
    for file in sorted(package.rglob("*.py")):
        for line, name in imported_modules(file.read_text()):
            top, where = name.split(".")[0], f"{file.relative_to(plugins_dir)}:{line}"
            if top == "populora_core" and name not in populora_core.PUBLIC_MODULES:
                bad.append(f"{where}: {name} is not a public core module")
            elif top in plugins and top not in (own, *declared):
                bad.append(f"{where}: {name} belongs to plugin {top}, which {own}.PLUGIN_REQUIRES does not declare")
    return bad


@pytest.mark.parametrize("package", sorted(p for p in PLUGINS.iterdir() if (p / "__init__.py").is_file()), ids=str)
def test_plugin_imports_only_public_core_modules_and_declared_plugins(package):
    assert violations(package) == []


def test_public_modules_exist_and_nothing_private_is_listed():
    for name in populora_core.PUBLIC_MODULES:
        assert _is_module(name), name
    assert "populora_core.run.loop" not in populora_core.PUBLIC_MODULES


def test_a_private_core_import_or_an_undeclared_plugin_is_caught(tmp_path, monkeypatch):
    plugins = tmp_path / "plugins"
    for name, source in {
        "populora_rogue": (
            "from populora_core import hookimpl, Params\n"
            "from populora_core.api.components import Problem\n"
            "from populora_core.run.loop import Run\n"
            "import populora_core.plugin.registry\n"
            "from populora_core import run_dir\n"
            "from populora_helper import thing\n"
        ),
        "populora_polite": "PLUGIN_REQUIRES = ('populora_helper',)\nfrom populora_helper import thing\n",
        "populora_helper": "thing = 1\n",
    }.items():
        (plugins / name).mkdir(parents=True)
        (plugins / name / "__init__.py").write_text(source)
    monkeypatch.syspath_prepend(str(plugins))
    assert violations(plugins / "populora_rogue", plugins) == [
        "populora_rogue/__init__.py:3: populora_core.run.loop is not a public core module",
        "populora_rogue/__init__.py:4: populora_core.plugin.registry is not a public core module",
        "populora_rogue/__init__.py:5: populora_core.run.run_dir is not a public core module",
        "populora_rogue/__init__.py:6: populora_helper belongs to plugin populora_helper, "
        "which populora_rogue.PLUGIN_REQUIRES does not declare",
    ]
    assert violations(plugins / "populora_polite", plugins) == []


LIFECYCLE_HOOKS = {"on_run_start", "on_run_end", "on_step_start", "after_matchmaking", "after_rewards"} | {
    "on_step_end",
    "before_evolution",
    "after_evolution",
    "on_checkpoint",
}
VIEW_FIELDS = {f.name for f in fields(RunView) if not f.name.startswith("_")} | {"emit"}


def run_reads_beyond_the_view(source: str) -> list[tuple[int, str]]:
    """(line, attribute) of every ``run.<attribute>`` a lifecycle hookimpl reads that RunView does not offer."""
    bad = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef) and fn.name in LIFECYCLE_HOOKS and any(a.arg == "run" for a in fn.args.args):
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "run":
                    if node.attr not in VIEW_FIELDS:
                        bad.append((node.lineno, node.attr))
    return bad


HOOK_SOURCES = [
    *PLUGINS.rglob("*.py"),
    *Path(__file__).parent.glob("*plugin*.py"),
    *Path(__file__).parent.glob("*_stack.py"),
]
HOOK_SOURCES += list(Path(__file__).parent.glob("thirdparty_*/**/*.py"))


@pytest.mark.parametrize("file", sorted(HOOK_SOURCES), ids=lambda p: str(p.relative_to(PLUGINS.parent)))
def test_lifecycle_hookimpls_read_only_what_the_run_view_offers(file):
    assert run_reads_beyond_the_view(file.read_text()) == []


def test_a_hookimpl_reaching_into_the_run_is_caught():
    source = (
        "@hookimpl\ndef on_step_end(run, step, metrics):\n"
        "    run.emit([metrics]); print(run.run_dir, run.steps_done)\n"
        "    run.trainer.workers[0].kill()\n"
        "def helper(run):\n    return run.dir\n"
    )
    assert run_reads_beyond_the_view(source) == [(4, "trainer")]


def package_import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports anywhere in its source (function bodies included:
    a deferred import is still a dependency a reader follows)."""
    modules = {p.stem: p for p in package.glob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 1:
                targets = [node.module] if node.module else [alias.name for alias in node.names]
            elif node.level == 0 and node.module and node.module.split(".")[0] == package.name:
                rest = node.module.split(".")[1:]
                targets = rest[:1] if rest else [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {t.split(".")[0] for t in targets if t and t.split(".")[0] in modules} - {name}
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path that ends where it starts, else None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], node, nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                found = visit(nxt, [*path, node])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [])
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize(
    "package",
    [Path(populora_core.__file__).parent, *sorted(p for p in PLUGINS.iterdir() if (p / "__init__.py").is_file())],
)
def test_no_import_cycles_inside_the_core_or_a_plugin(package):
    """A newcomer follows imports one way: no module of a package reaches itself through the package's imports,
    deferred ones included (``__init__`` is the package's registration surface and may import its modules)."""
    graph = package_import_graph(package)
    graph.pop("__init__", None)
    for deps in graph.values():
        deps.discard("__init__")
    assert import_cycle(graph) is None, f"{package.name}: import cycle {' -> '.join(import_cycle(graph) or [])}"
