"""Static checks (banned names, one-def rule, renaming, call parsing) and program metrics."""

from __future__ import annotations

import ast

import pytest
from populora_azr import checks
from populora_azr.metrics import ast_depth, program_metrics, signature

BANNED = checks.AZR_BANNED + checks.EXTRA_BANNED


def fixed(code: str) -> list[str]:
    return checks.banned_violations(ast.parse(code), BANNED)


def compat(code: str) -> list[str]:
    return checks.azr_banned_violations(ast.parse(code), checks.AZR_BANNED)


@pytest.mark.parametrize(
    "code",
    [
        "import os",
        "import os.path",
        "from os import path",
        "import sys\ndef f(a):\n    return sys.exit",
        "import random as r\ndef f(a):\n    return r.random()",
        "def f(a):\n    return __import__('os').getcwd()",
        "def f(a):\n    return eval(a)",
        "def f(a):\n    return open(a).read()",
        "def f(a):\n    return exec('x=1')",
        "def f(a):\n    return compile(a, 'x', 'eval')",
        "import math\ndef f(a):\n    return getattr(math, '__loader__')",
        "def f(a):\n    return ().__class__.__base__.__subclasses__()",
        "def f(a):\n    return f.__globals__",
        "def f(a):\n    return __builtins__",
        "from . import x",
        "def f(a):\n    return input()",
    ],
)
def test_fixed_banned_check_catches_what_azr_misses(code):
    assert fixed(code), code


def test_released_check_sees_imports_only_and_never_dotted_entries():
    assert compat("import random")
    assert compat("from random import randint")
    assert compat("import os.path") == []  # 'os.path' can never match a single component
    assert compat("from os import path") == []
    assert compat("import os") == []
    assert compat("import sys\ndef f(a):\n    return sys.exit") == []
    assert compat("def f(a):\n    return __import__('random').random()") == []
    assert compat("def f(a):\n    return eval(a)") == []


@pytest.mark.parametrize(
    "code",
    [
        "import math\ndef f(a):\n    return math.sqrt(a)",
        "from collections import Counter\ndef f(a):\n    return dict(Counter(a))",
        "def f(input, open=1):\n    return input + open",  # parameters shadowing builtins are fine
        "class Node:\n    def __init__(self, v):\n        self.v = v\n\ndef f(a):\n    return Node(a).v",
        "def f(time_list):\n    return sorted(time_list)",
        "import itertools\ndef f(a):\n    return list(itertools.accumulate(a))",
    ],
)
def test_fixed_banned_check_allows_ordinary_programs(code):
    assert fixed(code) == [], fixed(code)


def test_azr_def_count_includes_nested_and_methods():
    code = (
        "class Acc:\n    def __init__(self):\n        self.t = 0\n\n"
        "def f(a):\n    def helper(x):\n        return x + 1\n    return helper(a)"
    )
    assert checks.azr_def_names(code) == ["__init__", "f", "helper"]
    assert checks.top_level_functions(ast.parse(code)) == ["f"]


def test_renaming_to_f():
    code = "def solve(x):\n    # solve it\n    s = 'solve'\n    return solve_helper(x) if x else solve(1)"
    ours = checks.rename_identifier(code, "solve", "f")
    assert "def f(x)" in ours and "'solve'" in ours and "# solve it" in ours and "f(1)" in ours
    assert "solve_helper" in ours
    assert checks.azr_rename_def("class A:\n    def m(self):\n        return 1\n").count("def f(") == 1


def test_azr_rename_is_its_two_regex_replaces():
    """AZR: ``def <name>(`` -> ``def f(``, then ``<name>(`` at a word boundary -> ``f(`` (code_reward.py)."""
    code = (
        "def solve(s):\n    # solve it\n    t = 'solve(' + 'solve'\n    g = solve\n"
        "    return obj.solve (s) if s else solve(1) + solve_count(s)"
    )
    theirs = checks.azr_rename_def(code, "not_first")
    assert theirs.startswith("def f(s)") and "# solve it" in theirs  # a comment without a call is kept
    assert "'f(' + 'solve'" in theirs  # a call inside a string is hit, the bare word is not
    assert "g = solve" in theirs  # a reference without a call is not renamed (f then has no `solve`)
    assert "obj.f(s)" in theirs and "f(1)" in theirs and "solve_count(s)" in theirs


NAMES = {
    "helper then f": ["helper", "f"],
    "class then solve": ["__init__", "run", "solve"],
    "f then nested": ["f", "inner"],
    "none": [],
}


@pytest.mark.parametrize(
    "case,location,expected",
    [
        ("helper then f", "not_first", "helper"),  # always the first, even with an f (two f's then)
        ("helper then f", "any_first", None),
        ("helper then f", "any_last", None),
        ("helper then f", "not_last", None),  # the last is f already
        ("class then solve", "not_first", "__init__"),  # AZR's default: a class's __init__ becomes f
        ("class then solve", "any_first", "__init__"),
        ("class then solve", "any_last", "solve"),  # AZR's Llama / Qwen3-4B scripts
        ("class then solve", "not_last", "solve"),
        ("f then nested", "not_first", None),
        ("f then nested", "any_last", None),
        ("f then nested", "not_last", "inner"),  # always the last: f's nested helper
        ("none", "not_first", None),
        ("none", "any_last", None),
    ],
)
def test_f_replace_location_picks_as_azr(case, location, expected):
    assert checks.f_replace_target(NAMES[case], location) == expected


def test_f_replace_location_values():
    assert checks.F_REPLACE_LOCATIONS == ("not_first", "any_first", "any_last", "not_last")
    with pytest.raises(ValueError, match="f_replace_location"):
        checks.f_replace_target(["g"], "first")


def test_call_of_f_refuses_injection():
    assert ast.unparse(checks.call_of_f("'a', [1, 2], k=3")) == "f('a', [1, 2], k=3)"
    assert ast.unparse(checks.call_of_f("1  # trailing comment")) == "f(1)"
    for bad in ("1) or (1", "*[1]), f(2", "1)\nimport os\nf(1"):
        with pytest.raises(SyntaxError):
            checks.call_of_f(bad)


def test_imports_of_program():
    code = "import math\nfrom collections import deque as dq\n\ndef f(a):\n    import re\n    return a"
    assert checks.imports_of(ast.parse(code)) == "import math\nfrom collections import deque as dq"


def test_program_metrics_and_shape_signature():
    simple, sig1 = program_metrics("def f(a):\n    return a + 1")
    renamed = signature(ast.parse("def g(x):\n    return x + 7"))
    other = signature(ast.parse("def f(a):\n    return a * 1"))
    assert sig1 == renamed and sig1 != other and len(sig1) == 16
    assert simple["loc"] == 2 and simple["cyclomatic"] == 1
    branchy, _ = program_metrics(
        "def f(a):\n    total = 0\n    for x in a:\n        if x > 0:\n            total += x\n"
        "        elif x < -5:\n            total -= 1\n    return total"
    )
    assert branchy["cyclomatic"] == 4 and branchy["loc"] == 8
    assert branchy["ast_depth"] > simple["ast_depth"]


def test_ast_depth_survives_deep_nesting():
    deep = ast.parse("x = " + "[" * 200 + "]" * 200)
    assert ast_depth(deep) > 200
