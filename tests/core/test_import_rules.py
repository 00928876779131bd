"""Plugins import only the core's public floors (``populora_core.api``, ``populora_core.services`` and their
submodules) and the plugins they declare in ``PLUGIN_REQUIRES``, the third-party example packages under
``tests/thirdparty_*`` (what authors copy) too; each floor of the core imports only the floors below it (api <
services < plugin < recipe < run < cli); the api floor imports no torch, transformers or peft, not even inside a
function."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import fields
from pathlib import Path

import pytest

import populora_core
from populora_core.api.runview import RunView

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
TESTS = Path(__file__).resolve().parents[1]
CORE = Path(populora_core.__file__).parent
API = "populora_core.api"
#: The core's public floors, what a plugin may import
PUBLIC = (API, "populora_core.services")


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


def is_public(name: str) -> bool:
    return any(name == floor or name.startswith(floor + ".") for floor in PUBLIC)


def violations(package: Path, plugins_dir: Path = PLUGINS) -> list[str]:
    """Imports in one plugin package of the core outside its public floors or of a plugin it does not declare."""
    own = package.name
    declared = set(getattr(importlib.import_module(own), "PLUGIN_REQUIRES", ()))
    plugins = {p.name for folder in (plugins_dir, PLUGINS) for p in folder.iterdir() if (p / "__init__.py").is_file()}
    bad = []
    for file in sorted(package.rglob("*.py")):
        for line, name in imported_modules(file.read_text()):
            top, where = name.split(".")[0], f"{file.relative_to(plugins_dir)}:{line}"
            if top == "populora_core" and not is_public(name):
                bad.append(f"{where}: {name} is outside {' and '.join(PUBLIC)}, the core a plugin may import")
            elif top in plugins and top not in (own, *declared):
                bad.append(f"{where}: {name} belongs to plugin {top}, which {own}.PLUGIN_REQUIRES does not declare")
    return bad


@pytest.mark.parametrize("package", sorted(p for p in PLUGINS.iterdir() if (p / "__init__.py").is_file()), ids=str)
def test_plugin_imports_only_public_core_modules_and_declared_plugins(package):
    assert violations(package) == []


def test_public_modules_are_the_api_and_services_floors():
    """PUBLIC_MODULES documents every module a plugin may import: the api and services packages and their modules."""
    public = set(PUBLIC)
    for floor in PUBLIC:
        public |= {f"{floor}.{p.stem}" for p in (CORE / floor.rpartition(".")[2]).glob("*.py") if p.stem != "__init__"}
    assert set(populora_core.PUBLIC_MODULES) == public


def example_packages(tests_dir: Path = TESTS) -> list[Path]:
    """The third-party example packages: each ``thirdparty_*`` folder's package (beside its pyproject.toml)."""
    return sorted(p for d in tests_dir.glob("thirdparty_*") for p in d.iterdir() if (p / "__init__.py").is_file())


@pytest.mark.parametrize("package", example_packages(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_third_party_examples_import_only_public_core_modules(package, monkeypatch):
    monkeypatch.syspath_prepend(str(package.parent))  # as installed: the package at the top level
    assert violations(package, package.parent) == []


def test_a_third_party_example_on_the_old_path_is_caught(tmp_path, monkeypatch):
    example = tmp_path / "thirdparty_rogue" / "populora_rogue_example"
    example.mkdir(parents=True)
    (example / "__init__.py").write_text("from populora_core.api import hookimpl\nfrom populora_core import Params\n")
    assert example_packages(tmp_path) == [example]
    monkeypatch.syspath_prepend(str(example.parent))
    assert violations(example, example.parent) == [
        "populora_rogue_example/__init__.py:2: populora_core is outside populora_core.api and "
        "populora_core.services, the core a plugin may import"
    ]
    for name in populora_core.PUBLIC_MODULES:
        assert _is_module(name), name


def test_the_top_level_package_exports_the_api_list():
    """One export list: ``populora_core`` re-exports ``populora_core.api.__all__``, the same objects."""
    from populora_core import api

    assert set(populora_core.__all__) == {*api.__all__, "PLUGIN_API_VERSION", "PUBLIC_MODULES", "__version__"}
    assert all(getattr(populora_core, name) is getattr(api, name) for name in api.__all__)


def test_a_private_core_import_or_an_undeclared_plugin_is_caught(tmp_path, monkeypatch):
    plugins = tmp_path / "plugins"
    for name, source in {
        "populora_rogue": (
            "from populora_core.api import hookimpl, Params\n"
            "from populora_core.api.components import Problem\n"
            "from populora_core.services.modelhost import get_host\n"
            "from populora_core.run.loop import Run\n"
            "import populora_core.plugin.registry\n"
            "from populora_core.run import run_dir\n"
            "from populora_helper import thing\n"
            "from populora_core import hookimpl\n"
            "import populora_core.recipe.overrides\n"
        ),
        "populora_polite": "PLUGIN_REQUIRES = ('populora_helper',)\nfrom populora_helper import thing\n",
        "populora_helper": "thing = 1\n",
    }.items():
        (plugins / name).mkdir(parents=True)
        (plugins / name / "__init__.py").write_text(source)
    monkeypatch.syspath_prepend(str(plugins))
    outside = "is outside populora_core.api and populora_core.services, the core a plugin may import"
    assert violations(plugins / "populora_rogue", plugins) == [
        f"populora_rogue/__init__.py:4: populora_core.run.loop {outside}",
        f"populora_rogue/__init__.py:5: populora_core.plugin.registry {outside}",
        f"populora_rogue/__init__.py:6: populora_core.run {outside}",
        f"populora_rogue/__init__.py:6: populora_core.run.run_dir {outside}",
        "populora_rogue/__init__.py:7: populora_helper belongs to plugin populora_helper, "
        "which populora_rogue.PLUGIN_REQUIRES does not declare",
        f"populora_rogue/__init__.py:8: populora_core {outside}",
        f"populora_rogue/__init__.py:9: populora_core.recipe.overrides {outside}",
    ]
    assert violations(plugins / "populora_polite", plugins) == []


# --- the core's floors ---------------------------------------------------------------------------

#: The core's floors, bottom first: a module of a floor imports only its own floor and those below it.
FLOORS = ("api", "services", "plugin", "recipe", "run", "cli")
#: The one sanctioned upward arrow: ``populora_core.api.get_registry`` and ``build_engine`` reach the plugin
#: manager and the run's assembly inside the call, never when the api is imported.
LAZY_UPWARD = {("api/__init__.py", "populora_core.plugin.manager"), ("api/__init__.py", "populora_core.run.assembly")}


def module_of(root: Path, file: Path) -> tuple[str, bool]:
    """A file's dotted module name under ``root`` (the package directory) and whether it is a package."""
    parts = [root.name, *file.relative_to(root).with_suffix("").parts]
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def imports_of(root: Path, file: Path) -> list[tuple[int, str, bool]]:
    """(line, absolute dotted target, inside a function) of every import of ``root``'s package in ``file``;
    ``from pkg import name`` counts ``pkg.name`` when that is a module of the package."""
    module, is_package = module_of(root, file)
    here = module.split(".") if is_package else module.split(".")[:-1]
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            deferred = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = here[: len(here) - child.level + 1] if child.level else []
                target = ".".join([*base, *(child.module.split(".") if child.module else [])])
                subs = [f"{target}.{alias.name}" for alias in child.names]
                modules = [sub for sub in subs if _module_file(root, sub) is not None]
                targets = modules + ([target] if len(modules) < len(subs) else [])
            for target in targets:
                if target.split(".")[0] == root.name:
                    found.append((child.lineno, target, deferred))
            visit(child, deferred)

    visit(ast.parse(file.read_text()), False)
    return found


def _module_file(root: Path, dotted: str) -> Path | None:
    rest = dotted.split(".")[1:]
    for candidate in (root.joinpath(*rest).with_suffix(".py"), root.joinpath(*rest, "__init__.py")):
        if rest and candidate.is_file():
            return candidate
    return None


def floor_of(root: Path, dotted: str) -> str | None:
    """The floor a module of the package is on. The top-level package counts as the floor above api (it imports the
    api floor to re-export its names, so an api module importing it reaches above itself); a module outside every
    floor's folder is on none (None)."""
    rest = dotted.split(".")[1:]
    if not rest:
        return FLOORS[1]
    return rest[0] if rest[0] in FLOORS else None


def upward_imports(root: Path = CORE, lazy_upward: set[tuple[str, str]] = LAZY_UPWARD) -> list[str]:
    """``file:line: ...`` for every import of a floor module that reaches a floor above its own (the top-level
    package counts as the floor above api) or a module outside the floors, and every module outside them (the
    top-level package excepted). Deferred imports count: a reader follows them."""
    bad = []
    for file in sorted(root.rglob("*.py")):
        where = file.relative_to(root).as_posix()
        module = module_of(root, file)[0]
        floor = floor_of(root, module)
        if module == root.name:
            continue  # the top-level package sits beside the floors and re-exports the api
        if floor is None:
            bad.append(f"{root.name}/{where}: outside every floor ({', '.join(FLOORS)})")
            continue
        for line, target, deferred in imports_of(root, file):
            above = floor_of(root, target)
            what = f"{root.name}/{where}:{line}: {floor} imports {target}"
            if (where, target) in lazy_upward and deferred:
                continue
            if above is None:
                bad.append(f"{what}, a module outside the floors")
            elif FLOORS.index(above) > FLOORS.index(floor):
                top = " (the top-level package, which imports the api floor)" if target == root.name else ""
                bad.append(f"{what}{top}, a floor above it ({above})")
    return bad


def test_each_floor_imports_only_the_floors_below_it():
    assert upward_imports() == []


def test_an_upward_import_is_caught_with_its_line(tmp_path):
    root = tmp_path / "populora_core"
    sources = {
        "__init__.py": "from .api.errors import UserError\n",
        "api/__init__.py": "def get_registry():\n    from ..plugin.manager import get_registry\n",
        "api/errors.py": "class UserError(Exception): ...\n",
        "api/params.py": "from .errors import UserError\nfrom ..run import loop\n",
        "api/rng.py": "def f():\n    from populora_core.cli.main import main\n",
        "api/probe.py": "from .. import UserError\n",
        "services/__init__.py": "",
        "services/gpu.py": "from ..api.errors import UserError\nfrom ..plugin import manager\n",
        "plugin/__init__.py": "",
        "plugin/manager.py": "from ..api.errors import UserError\n",
        "run/__init__.py": "",
        "run/loop.py": "from ..plugin import manager\nfrom ..cli import main\nfrom .. import rng\n",
        "rng.py": "from .api.rng import *\n",
        "cli/__init__.py": "",
        "cli/main.py": "from ..run.loop import x\nimport populora_core.api.rng\n",
    }
    for name, source in sources.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source)
    assert upward_imports(root, {("api/__init__.py", "populora_core.plugin.manager")}) == [
        "populora_core/api/params.py:2: api imports populora_core.run.loop, a floor above it (run)",
        "populora_core/api/probe.py:1: api imports populora_core (the top-level package, which imports the api "
        "floor), a floor above it (services)",
        "populora_core/api/rng.py:2: api imports populora_core.cli.main, a floor above it (cli)",
        "populora_core/rng.py: outside every floor (api, services, plugin, recipe, run, cli)",
        "populora_core/run/loop.py:2: run imports populora_core.cli.main, a floor above it (cli)",
        "populora_core/run/loop.py:3: run imports populora_core.rng, a module outside the floors",
        "populora_core/services/gpu.py:2: services imports populora_core.plugin.manager, a floor above it (plugin)",
    ]
    sources["api/params.py"] = "from .errors import UserError\n"
    (root / "api/params.py").write_text(sources["api/params.py"])
    assert "populora_core/api/params.py" not in " ".join(upward_imports(root, set()))
    assert "populora_core/api/__init__.py:2: api imports populora_core.plugin.manager" in " ".join(
        upward_imports(root, set())
    )


#: What the api floor never imports, not even inside a function: reading a contract must cost nothing.
HEAVY = ("torch", "transformers", "peft", "safetensors", "vllm", "trl")


def heavy_imports(root: Path = CORE) -> list[str]:
    """``file:line: ...`` for every import of a heavy library in the api floor, deferred ones included; an import
    under ``if TYPE_CHECKING:`` is for type checkers only and never runs, so it does not count."""
    bad = []

    def visit(node: ast.AST, where: str, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other, where, in_function)
                continue
            names = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            for name in names:
                if name.split(".")[0] in HEAVY:
                    when = "inside a function" if in_function else "at import"
                    bad.append(f"{where}:{child.lineno}: the api floor imports {name} ({when})")
            visit(child, where, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    for file in sorted((root / "api").rglob("*.py")):
        visit(ast.parse(file.read_text()), f"{root.name}/{file.relative_to(root).as_posix()}", False)
    return bad


def test_the_api_floor_imports_no_heavy_library_even_inside_a_function():
    assert heavy_imports() == []


def test_a_heavy_import_in_the_api_floor_is_caught_with_its_line(tmp_path):
    root = tmp_path / "populora_core"
    (root / "api").mkdir(parents=True)
    (root / "services").mkdir()
    (root / "api" / "lora.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
        "def f():\n    import torch\n    from peft import LoraConfig\n"
    )
    (root / "api" / "memory.py").write_text("import safetensors.torch\nfrom transformers import AutoConfig\n")
    (root / "services" / "gpu.py").write_text("import torch\n")  # the services floor may
    assert heavy_imports(root) == [
        "populora_core/api/lora.py:5: the api floor imports torch (inside a function)",
        "populora_core/api/lora.py:6: the api floor imports peft (inside a function)",
        "populora_core/api/memory.py:1: the api floor imports safetensors.torch (at import)",
        "populora_core/api/memory.py:2: the api floor imports transformers (at import)",
    ]


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


TESTS = Path(__file__).resolve().parents[1]
HOOK_SOURCES = [
    *PLUGINS.rglob("*.py"),
    *TESTS.glob("*plugin*.py"),
    *TESTS.glob("*/test_*plugin*.py"),  # tests/core/test_core_plugins.py's hookimpls
    *TESTS.glob("*_stack.py"),
]
HOOK_SOURCES += list(TESTS.glob("thirdparty_*/**/*.py"))


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
    """Module -> the modules of the same package (dotted, sub-packages included) it imports anywhere in its source
    (function bodies included: a deferred import is still a dependency a reader follows)."""
    files = {module_of(package, path)[0]: path for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        for _, target, _ in imports_of(package, path):
            while target not in files and "." in target:
                target = target.rpartition(".")[0]  # a name inside a module: the module
            graph[name] |= {target} - {name}
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
    deferred ones included (the top ``__init__`` is the package's registration surface and may import its modules)."""
    graph = package_import_graph(package)
    graph.pop(package.name, None)
    for deps in graph.values():
        deps.discard(package.name)
    assert import_cycle(graph) is None, f"{package.name}: import cycle {' -> '.join(import_cycle(graph) or [])}"


# --- benchmarks ----------------------------------------------------------------------------------

BENCHMARKS = PLUGINS.parent / "benchmarks"
#: What a benchmark (a script) may import of the core: the public floors and the driver, the public entry for scripts.
SCRIPT_PUBLIC = (*PUBLIC, "populora_core.cli.driver")


def script_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every absolute import, deferred ones included; ``from pkg import a`` counts ``pkg.a`` when
    it is a module and ``pkg`` itself only when some name it imports is not a module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            subs = [f"{node.module}.{alias.name}" for alias in node.names]
            modules = [sub for sub in subs if _is_module(sub)]
            found += [(node.lineno, name) for name in modules + ([node.module] if len(modules) < len(subs) else [])]
    return sorted(found)


def benchmark_violations(root: Path = BENCHMARKS) -> list[str]:
    """``file:line: ...`` for every import under ``root`` of the core outside SCRIPT_PUBLIC or of ``tests``."""
    bad = []
    for file in sorted(root.rglob("*.py")):
        for line, name in script_imports(file.read_text()):
            top, where = name.split(".")[0], f"{file.relative_to(root.parent).as_posix()}:{line}"
            if top == "populora_core" and not any(name == m or name.startswith(m + ".") for m in SCRIPT_PUBLIC):
                bad.append(f"{where}: {name} is private to the core (a benchmark imports {', '.join(SCRIPT_PUBLIC)})")
            elif top == "tests":
                bad.append(f"{where}: {name} is a test helper (a benchmark's own helpers live in benchmarks/)")
    return bad


def test_benchmarks_import_only_the_public_core_and_the_driver():
    assert benchmark_violations() == []


def test_a_benchmark_importing_a_private_module_or_a_test_helper_is_caught(tmp_path):
    root = tmp_path / "benchmarks"
    (root / "research").mkdir(parents=True)
    (root / "fine.py").write_text(
        "from populora_core.api import get_registry\nfrom populora_core.services.gpu import visible_gpu_bytes\n"
        "from populora_core.cli import driver\nfrom populora_core.cli.driver import start_run\n"
        "import populora_core.cli.driver as d\nfrom populora_azr.problems import CodeProblem\nfrom .tiny import x\n"
    )
    (root / "research" / "rogue.py").write_text(
        "from populora_core import get_registry\n"
        "def run():\n"
        "    from populora_core.run.loop import start_run\n"
        "    from populora_core.recipe import validate\n"
        "    import populora_core.cli.doctor\n"
        "    from tests.tiny_model import build\n"
        "    from tests import conftest\n"
        "from populora_core.cli import main\n"
    )
    private = "is private to the core (a benchmark imports populora_core.api, populora_core.services, "
    private += "populora_core.cli.driver)"
    helper = "is a test helper (a benchmark's own helpers live in benchmarks/)"
    assert benchmark_violations(root) == [
        f"benchmarks/research/rogue.py:1: populora_core {private}",
        f"benchmarks/research/rogue.py:3: populora_core.run.loop {private}",
        f"benchmarks/research/rogue.py:4: populora_core.recipe.validate {private}",
        f"benchmarks/research/rogue.py:5: populora_core.cli.doctor {private}",
        f"benchmarks/research/rogue.py:6: tests.tiny_model {helper}",
        f"benchmarks/research/rogue.py:7: tests.conftest {helper}",
        f"benchmarks/research/rogue.py:8: populora_core.cli {private}",
    ]
