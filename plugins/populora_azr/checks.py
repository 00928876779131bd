"""Static checks on model-written code: banned names, the one-``def`` rule, renaming to ``f``, imports.

Two behaviours for each check: ours (``fixed``, AST-based, enforced on imports, attribute access and
builtins) and AZR's released one (``azr-released``: imports only, dotted entries never match, a regex
that counts every ``def``). None of this executes anything: it only parses.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable, Sequence

#: AZR's released banned-word list (yaml ``banned_words``; ``datetime`` appears twice there).
AZR_BANNED = (
    "logging",
    "random",
    "multiprocessing",
    "pebble",
    "subprocess",
    "threading",
    "datetime",
    "time",
    "hashlib",
    "hmac",
    "bcrypt",
    "os.sys",
    "os.path",
    "sys.exit",
    "os.environ",
    "calendar",
)

#: What we add by default: the paper's text ("os.sys, sys, shutil"), ways out of the process, and
#: introspection that reaches the interpreter's internals. The sandbox contains them anyway; banning
#: them keeps proposals about computation rather than about the machine.
EXTRA_BANNED = (
    "os",
    "sys",
    "shutil",
    "socket",
    "builtins",
    "importlib",
    "ctypes",
    "gc",
    "inspect",
    "signal",
    "pathlib",
    "tempfile",
    "glob",
    "urllib",
    "http",
    "asyncio",
    "concurrent",
    "sched",
    "uuid",
    "secrets",
    "resource",
    "pickle",
    "marshal",
    "code",
    "codeop",
    "pty",
    "select",
)

DEFAULT_BANNED_BUILTINS = (
    "__import__",
    "eval",
    "exec",
    "compile",
    "open",
    "input",
    "breakpoint",
    "globals",
    "locals",
    "vars",
    "exit",
    "quit",
    "help",
)

DEFAULT_BANNED_ATTRIBUTES = (
    "__globals__",
    "__builtins__",
    "__subclasses__",
    "__code__",
    "__closure__",
    "__bases__",
    "__base__",
    "__mro__",
    "__loader__",
    "__spec__",
    "__import__",
    "f_globals",
    "f_locals",
    "f_back",
    "f_builtins",
    "gi_frame",
    "cr_frame",
    "tb_frame",
)

_GETATTR_LIKE = {"getattr", "setattr", "delattr", "hasattr"}


def _matches(dotted: str, banned: Iterable[str]) -> str | None:
    """The banned entry that ``dotted`` (``os.path.join``) equals or lies under, if any."""
    for entry in banned:
        if dotted == entry or dotted.startswith(entry + "."):
            return entry
    return None


def _dotted(node: ast.AST) -> tuple[str, ...] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return tuple(reversed(parts))
    return None


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the code binds itself (assignments, parameters, defs, imports, loop targets)."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound


def banned_violations(
    tree: ast.AST,
    banned: Sequence[str],
    builtins: Sequence[str] = DEFAULT_BANNED_BUILTINS,
    attributes: Sequence[str] = DEFAULT_BANNED_ATTRIBUTES,
) -> list[str]:
    """Our check: banned modules on imports *and* attribute chains, banned builtins, internals.

    ``import os as o; o.environ`` is resolved through the alias; ``from os import path`` is ``os.path``.
    A banned builtin counts only where the code did not bind that name itself.
    """
    found: list[str] = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                hit = _matches(alias.name, banned)
                if hit:
                    found.append(f"import {alias.name} (banned: {hit})")
                local = alias.asname or alias.name.split(".")[0]
                aliases[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append("relative import")
                continue
            module = node.module or ""
            hit = _matches(module, banned)
            if hit:
                found.append(f"from {module} import (banned: {hit})")
            for alias in node.names:
                if alias.name == "*":
                    continue
                full = f"{module}.{alias.name}"
                hit = _matches(full, banned)
                if hit:
                    found.append(f"from {module} import {alias.name} (banned: {hit})")
                aliases[alias.asname or alias.name] = full
    bound = _bound_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr in attributes:
                found.append(f"attribute {node.attr}")
            chain = _dotted(node)
            if chain and chain[0] in aliases:
                dotted = ".".join((aliases[chain[0]], *chain[1:]))
                hit = _matches(dotted, banned)
                if hit:
                    found.append(f"{'.'.join(chain)} (banned: {hit})")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in attributes:
                found.append(f"name {node.id}")
            elif node.id in builtins and node.id not in bound:
                found.append(f"builtin {node.id}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _GETATTR_LIKE:
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                name = node.args[1].value
                if name.startswith("__") or name in attributes:
                    found.append(f"{node.func.id}(..., {name!r})")
                target = _dotted(node.args[0]) if node.args else None
                if target and target[0] in aliases:
                    hit = _matches(".".join((aliases[target[0]], *target[1:], name)), banned)
                    if hit:
                        found.append(f"{node.func.id}({'.'.join(target)}, {name!r}) (banned: {hit})")
            elif node.args and (t := _dotted(node.args[0])) and t[0] in aliases:
                found.append(f"{node.func.id} on module {'.'.join(t)} with a computed name")
    return sorted(set(found))


def azr_banned_violations(tree: ast.AST, banned: Sequence[str]) -> list[str]:
    """AZR released: only import nodes; a module name split on dots, each part compared with each entry.

    So dotted entries (``os.path``, ``sys.exit``) can never match, and ``import os`` passes.
    """
    found: list[str] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            for part in name.split("."):
                if part in banned:
                    found.append(f"import {name} (banned: {part})")
    return found


# --- function definitions ---------------------------------------------------------------------------------

_AZR_DEF_RE = re.compile(r"^\s*def\s+(\w+)\s*\(", re.MULTILINE)


def azr_def_names(code: str) -> list[str]:
    """Every ``def`` AZR's regex sees: nested functions and class methods included (even inside strings)."""
    return _AZR_DEF_RE.findall(code)


def top_level_functions(tree: ast.Module) -> list[str]:
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def rename_identifier(code: str, old: str, new: str) -> str:
    """Rename ``old`` to ``new`` as an identifier only (not in strings, comments or ``obj.old``)."""
    if old == new:
        return code
    tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    lines = code.splitlines(keepends=True)
    edits: list[tuple[int, int, int]] = []
    prev = None
    for tok in tokens:
        if tok.type == tokenize.NAME and tok.string == old and not (prev is not None and prev.string == "."):
            edits.append((tok.start[0], tok.start[1], tok.end[1]))
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            prev = tok
    for row, c0, c1 in reversed(edits):
        line = lines[row - 1]
        lines[row - 1] = line[:c0] + new + line[c1:]
    return "".join(lines)


#: AZR's ``f_replace_location`` values: which definition is renamed to ``f``.
F_REPLACE_LOCATIONS = ("not_first", "any_first", "any_last", "not_last")


def f_replace_target(names: Sequence[str], location: str) -> str | None:
    """The definition AZR's ``f_replace_location`` renames to ``f`` (None: nothing to rename).

    ``not_first``: the first definition, always (even when a later one is already called ``f``);
    ``any_first`` / ``any_last``: none when some definition is already called ``f``, else the first / last;
    ``not_last``: the last definition, always. ``names`` in source order (``code_reward.py`` l.362-385).
    """
    if location not in F_REPLACE_LOCATIONS:
        raise ValueError(f"f_replace_location must be one of {F_REPLACE_LOCATIONS}, not {location!r}")
    if not names or (location.startswith("any_") and "f" in names):
        return None
    name = names[0] if location.endswith("_first") else names[-1]
    return None if name == "f" else name


def azr_rename_def(code: str, location: str = "not_first") -> str:
    """AZR released: rename the definition ``location`` picks among every ``def`` its regex sees.

    AZR's two regex replaces: ``def <name>(`` becomes ``def f(``, then every ``<name>(`` at a word boundary
    becomes ``f(``, so calls inside strings and ``obj.<name>(`` are hit, a reference without a call is not.
    """
    name = f_replace_target(azr_def_names(code), location)
    if name is None:
        return code
    code = re.sub(rf"def\s+{re.escape(name)}\s*\(", "def f(", code)
    return re.sub(rf"\b{re.escape(name)}\s*\(", "f(", code)


def imports_of(tree: ast.Module) -> str:
    """The program's top-level import statements, one per line (prepended to induction answers)."""
    return "\n".join(ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))


def call_of_f(args_text: str) -> ast.Expression:
    """``f(<args_text>)`` parsed as one call of ``f`` (rejects text that closes the call and adds more)."""
    tree = ast.parse(f"f({args_text}\n)", mode="eval")
    body = tree.body
    if not (isinstance(body, ast.Call) and isinstance(body.func, ast.Name) and body.func.id == "f"):
        raise SyntaxError("the input is not just the arguments of one call of f")
    return tree
