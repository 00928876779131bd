"""Program metrics for dynamics plots: AST depth and size, cyclomatic complexity, lines, shape signature.

The signature is a hash of the AST's *shape*: node types only, no identifiers, constants or
contexts, so ``def f(a): return a + 1`` and ``def g(x): return x + 7`` share one signature. The
number of distinct signatures over time measures how much of the problem space a population covers.
"""

from __future__ import annotations

import ast
import hashlib
from typing import Any

_SKIP = (ast.expr_context, ast.Load, ast.Store, ast.Del)


def ast_depth(tree: ast.AST) -> int:
    """Longest root-to-leaf path, counting nodes (iterative: model code can nest deeply)."""
    best = 0
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        best = max(best, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node) if not isinstance(child, _SKIP))
    return best


def shape(tree: ast.AST) -> str:
    """Node types in pre-order with explicit nesting, e.g. ``Module(FunctionDef(arguments(arg)Return(Name)))``."""
    out: list[str] = []
    stack: list[Any] = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        children = [c for c in ast.iter_child_nodes(item) if not isinstance(c, _SKIP)]
        out.append(type(item).__name__)
        if children:
            out.append("(")
            stack.append(")")
            stack.extend(reversed(children))
    return "".join(out)


def signature(tree: ast.AST) -> str:
    """16 hex digits of the SHA-256 of :func:`shape`."""
    return hashlib.sha256(shape(tree).encode()).hexdigest()[:16]


def program_metrics(code: str) -> tuple[dict[str, Any], str]:
    """``({ast_depth, ast_nodes, cyclomatic, loc}, signature)`` of a program that parses."""
    from radon.raw import analyze
    from radon.visitors import ComplexityVisitor

    tree = ast.parse(code)
    metrics: dict[str, Any] = {
        "ast_depth": ast_depth(tree),
        "ast_nodes": sum(1 for n in ast.walk(tree) if not isinstance(n, _SKIP)),
        "cyclomatic": int(ComplexityVisitor.from_ast(tree).total_complexity),
        "loc": int(analyze(code).sloc),
    }
    return metrics, signature(tree)
