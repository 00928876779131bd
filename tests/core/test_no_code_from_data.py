"""Nothing the toolkit reads can run code (issue 51): an AST walk over every Python file of the repository fails on

- ``pickle.load``/``loads`` (and ``Unpickler`` used as is; ``_pickle``, ``dill``, ``cloudpickle`` alike): a
  subclass that refuses every global (``find_class``) is how plain-data pickles are read;
- ``torch.load`` without ``weights_only=True``;
- ``yaml.load``/``load_all`` without a safe loader (``SafeLoader``, ``CSafeLoader``, ``BaseLoader`` or a class of the
  same file built on one), and ``yaml.unsafe_load``/``full_load`` at all;
- ``numpy.load`` with ``allow_pickle=True``;
- ``eval``/``exec`` outside the places listed in :data:`EXEC_ALLOWED`, each with why it is not data being run: the
  sandbox that runs model-written programs and fixed text of the project's own. (The graders that run in the
  sandbox, ``populora_evals.grading``'s harness, and the benchmark's UNSAFE reference worker are program text sent
  to a process, not calls here.)

The test plants each violation in a scratch tree and checks the walk finds exactly those.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("populora_core", "plugins", "benchmarks", "scripts", "tests")

#: file -> the functions (qualified names) in it that may call eval/exec, and why that is not running data.
EXEC_ALLOWED: dict[str, dict[str, str]] = {
    "plugins/populora_sandbox/_zygote.py": {
        "_child": "the sandbox itself: the forked, filtered, unprivileged child that runs a model-written program",
    },
    "plugins/populora_azr/sandbox_code.py": {
        "_sandbox_equality": "the project's own FIXED_HELPERS text (a constant), the same the sandbox runs",
    },
    "tests/core/test_core_loop.py": {
        "test_export_writes_a_peft_folder_with_its_card_and_a_merged_model_that_computes_the_same": "runs the "
        "snippet of the card this test exported, as a user would",
    },
}


def _qualified(module: ast.Module) -> dict[str, str]:
    """What each imported name stands for: ``import pickle as p`` -> {p: pickle}, ``from yaml import load`` ->
    {load: yaml.load}."""
    names: dict[str, str] = {}
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr, names: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    head = names.get(node.id, node.id)
    return ".".join([head, *reversed(parts)])


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


_PICKLES = ("pickle", "_pickle", "cPickle", "dill", "cloudpickle")
_SAFE_YAML = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}


def _safe_yaml_classes(module: ast.Module, names: dict[str, str]) -> set[str]:
    """Classes of the file built on a safe YAML loader (``class _UniqueKeyLoader(yaml.SafeLoader)``), transitively."""
    safe = set(_SAFE_YAML)
    classes = [n for n in ast.walk(module) if isinstance(n, ast.ClassDef)]
    grew = True
    while grew:
        grew = False
        for cls in classes:
            if cls.name in safe:
                continue
            if any((_dotted(b, names) or "").split(".")[-1] in safe for b in cls.bases):
                safe.add(cls.name)
                grew = True
    return safe


def _functions(module: ast.Module) -> dict[ast.AST, str]:
    """Each node's enclosing function's qualified name (``<module>`` at the top)."""
    owner: dict[ast.AST, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = name
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = child.name if name == "<module>" else f"{name}.{child.name}"
            owner[child] = inner
            visit(child, inner)

    visit(module, "<module>")
    return owner


def violations(root: Path, allowed: dict[str, dict[str, str]]) -> list[str]:
    """``path:line: what`` for every call that would run code from data, under ``root``'s :data:`ROOTS`."""
    found: list[tuple[str, int, str]] = []
    files = sorted(f for top in ROOTS if (root / top).is_dir() for f in (root / top).rglob("*.py"))
    for file in files:
        rel = str(file.relative_to(root))
        if "/.venv" in f"/{rel}" or "/fixtures/" in rel:
            continue
        module = ast.parse(file.read_text(encoding="utf-8"), filename=rel)
        names = _qualified(module)
        safe_yaml = _safe_yaml_classes(module, names)
        owner = _functions(module)
        for node in ast.walk(module):
            if not isinstance(node, ast.Call):
                continue
            what = _dotted(node.func, names) or ""
            head, _, tail = what.rpartition(".")
            problem = None
            if head in _PICKLES and tail in ("load", "loads", "Unpickler"):
                problem = f"{what}: unpickling runs whatever the data names"
            elif what in ("torch.load", "torch.serialization.load"):
                flag = _keyword(node, "weights_only")
                if not (isinstance(flag, ast.Constant) and flag.value is True):
                    problem = "torch.load without weights_only=True"
            elif what in ("yaml.unsafe_load", "yaml.full_load", "yaml.unsafe_load_all", "yaml.full_load_all"):
                problem = f"{what}: constructs arbitrary objects"
            elif what in ("yaml.load", "yaml.load_all"):
                loader = _keyword(node, "Loader") or (node.args[1] if len(node.args) > 1 else None)
                if loader is None or (_dotted(loader, names) or "").split(".")[-1] not in safe_yaml:
                    problem = f"{what} without a safe loader"
            elif what in ("numpy.load", "np.load"):
                flag = _keyword(node, "allow_pickle")
                if not (flag is None or (isinstance(flag, ast.Constant) and flag.value is False)):
                    problem = "numpy.load with allow_pickle"
            elif what in ("eval", "exec", "builtins.eval", "builtins.exec"):
                where = owner.get(node, "<module>")
                if where not in allowed.get(rel, {}) and where.split(".")[0] not in allowed.get(rel, {}):
                    problem = f"{what}() in {where}, outside the sandbox and the places allowed to run code"
            if problem:
                found.append((rel, node.lineno, problem))
    return [f"{rel}:{line}: {problem}" for rel, line, problem in sorted(found)]


def test_nothing_in_the_repository_runs_code_from_data():
    assert violations(REPO, EXEC_ALLOWED) == []


def test_every_allowed_place_still_exists():
    """An allowlist entry whose function is gone (renamed, moved) allows nothing and hides nothing."""
    for rel, functions in EXEC_ALLOWED.items():
        module = ast.parse((REPO / rel).read_text(encoding="utf-8"))
        defined = {"<module>"} | set(_functions(module).values())
        assert set(functions) <= defined, f"{rel}: {set(functions) - defined}"


PLANTED = """\
import pickle
import pickle as pk
from pickle import loads
import yaml
from yaml import load as yload
import torch
import numpy as np


class Safe(yaml.SafeLoader):
    pass


def bad(blob, text, path):
    pickle.load(open(path, "rb"))
    pk.loads(blob)
    loads(blob)
    pickle.Unpickler(open(path, "rb")).load()
    torch.load(path)
    torch.load(path, weights_only=False)
    yaml.load(text)
    yload(text, Loader=yaml.Loader)
    yaml.unsafe_load(text)
    np.load(path, allow_pickle=True)
    eval(text)
    exec(text)


def fine(blob, text, path):
    torch.load(path, map_location="cpu", weights_only=True)
    yaml.load(text, Loader=Safe)
    yaml.load(text, Loader=yaml.CSafeLoader)
    yaml.safe_load(text)
    np.load(path)
    model.eval()
    allowed_here(text)


def allowed_here(text):
    exec(text)


class Plain(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(name)
"""


def test_the_walk_finds_exactly_the_planted_violations(tmp_path):
    (tmp_path / "plugins" / "someone").mkdir(parents=True)
    (tmp_path / "plugins" / "someone" / "mod.py").write_text(PLANTED)
    found = violations(tmp_path, {"plugins/someone/mod.py": {"allowed_here": "planted"}})
    lines = PLANTED.splitlines()
    bad_start = lines.index("def bad(blob, text, path):") + 1
    expected_lines = list(range(bad_start + 1, bad_start + 13))
    assert [int(f.split(":")[1]) for f in found] == expected_lines, found
    assert [f.split(": ", 1)[1] for f in found] == [
        "pickle.load: unpickling runs whatever the data names",
        "pickle.loads: unpickling runs whatever the data names",
        "pickle.loads: unpickling runs whatever the data names",
        "pickle.Unpickler: unpickling runs whatever the data names",
        "torch.load without weights_only=True",
        "torch.load without weights_only=True",
        "yaml.load without a safe loader",
        "yaml.load without a safe loader",
        "yaml.unsafe_load: constructs arbitrary objects",
        "numpy.load with allow_pickle",
        "eval() in bad, outside the sandbox and the places allowed to run code",
        "exec() in bad, outside the sandbox and the places allowed to run code",
    ]
    allowed_line = lines.index("def allowed_here(text):") + 2
    unallowed = f"plugins/someone/mod.py:{allowed_line}: exec() in allowed_here, outside the sandbox and the places"
    assert violations(tmp_path, {}) == [*found, f"{unallowed} allowed to run code"]
