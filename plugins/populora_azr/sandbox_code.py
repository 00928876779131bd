"""The code run in the sandbox next to a model's program: the helpers that compute its value as plain data and
compare an answer with the gold output (``fixed``), AZR's released ones (``azr-released``), and the same comparison
computed in this process for a deduction answer that is literal data (parsing and comparing literals runs no code).
``populora_nano``'s corpus builder runs :data:`FIXED_HELPERS` too, so keep its helper names stable."""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from typing import Any, cast

#: Our helpers. The real builtins are captured as default arguments when the helpers are defined, so
#: neither the program's globals (``int = MyInt``) nor side effects of the answer change what they check.
FIXED_HELPERS = """
import ast as _populora_ast
import builtins as _populora_b


def _populora_plain(x, _B=_populora_b, _seqs=(_populora_b.list, _populora_b.tuple, _populora_b.set,
                                               _populora_b.frozenset),
                    _atoms=(_populora_b.int, _populora_b.float, _populora_b.complex, _populora_b.str,
                            _populora_b.bytes, _populora_b.bool, _populora_b.type(None))):
    stack, seen = [x], _B.set()
    while stack:
        y = stack.pop()
        t = _B.type(y)
        if t in _atoms:
            continue
        if _B.id(y) in seen:
            continue
        if t in _seqs:
            seen.add(_B.id(y))
            stack.extend(y)
        elif t is _B.dict:
            seen.add(_B.id(y))
            stack.extend(y.keys())
            stack.extend(y.values())
        else:
            return False
    return True


def _populora_value(thunk, _B=_populora_b, _plain=_populora_plain, _lit=_populora_ast.literal_eval):
    first = thunk()
    second = thunk()
    if _B.repr(first) != _B.repr(second):
        raise _B.RuntimeError("non-deterministic: two calls in one process returned different values")
    if not _plain(first):
        raise _B.TypeError("the output is not plain literal data (numbers, strings, bytes, None, list, "
                           "tuple, dict, set)")
    try:
        same = _lit(_B.repr(first)) == first
    except _B.Exception:
        same = False
    if not same:
        raise _B.ValueError("the output's repr does not evaluate back to the output")
    return first


def _populora_eq(gold_text, value, _plain=_populora_plain, _lit=_populora_ast.literal_eval):
    return _plain(value) and _lit(gold_text) == value
"""


#: AZR's released determinism template, reconstructed: two calls in one process compared with ``!=``.
COMPAT_HELPERS = """

def _azr_twice(thunk):
    first = thunk()
    second = thunk()
    if first != second:
        raise Exception("Non-deterministic code")
    return first
"""


COMPAT_TRUNCATE = 400


def azr_truncate(text: str, limit: int = COMPAT_TRUNCATE) -> str:
    """AZR's result normalisation: strip, then keep the first and last ``limit/2`` characters."""
    text = text.strip()
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + "..." + text[-half:]


def safe_literal(text: str) -> tuple[bool, Any]:
    """``ast.literal_eval`` that reports failure (also on absurd nesting) instead of raising."""
    try:
        return True, ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


#: deeper literals go to the sandbox: near the recursion limit its stack and ours could disagree
LITERAL_DEPTH = 50


def literal_verdict(gold: str, answer: str) -> bool | None:
    """The sandbox's deduction check, ``_populora_eq(gold, literal_eval(answer))``, computed here: parsing and
    comparing literal data runs no code. None where it could differ from the sandbox's (a deep literal, or
    recursion or memory limits hit here): the caller runs the sandbox job."""
    depth = deepest = 0
    for char in answer:
        depth += (char in "([{") - (char in ")]}")
        deepest = max(deepest, depth)
    if deepest > LITERAL_DEPTH:
        return None
    try:
        return bool(_sandbox_equality()(gold, ast.literal_eval(answer)))
    except (ValueError, TypeError, SyntaxError):  # the sandbox's literal_eval raises too: a wrong answer
        return False
    except (MemoryError, RecursionError):
        return None


@functools.cache
def _sandbox_equality() -> Callable[[str, Any], bool]:
    """``_populora_eq`` of :data:`FIXED_HELPERS`, defined here from the same text the sandbox runs: a deduction
    answer is literal data, so its check runs no program (about a third of a step's sandbox jobs, a fork each)."""
    helpers: dict[str, Any] = {}
    exec(compile(FIXED_HELPERS, "<populora helpers>", "exec"), helpers)
    return cast(Callable[[str, Any], bool], helpers["_populora_eq"])
