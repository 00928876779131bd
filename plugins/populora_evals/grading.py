"""Grading: math answers through math-verify, programs through the project's sandbox executor.

Code is never run in this process. Each program becomes :class:`ExecJob` s for the executor
(``Executor.run_batch``): MBPP asserts one job each; HumanEval's ``check`` one job per problem;
EvalPlus and LiveCodeBench tests in chunks run by a small harness that gives every test its own
timer (``signal.setitimer``) and stops at the first failure, with the job's own timeout as backstop.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from populora_core.api.components import ExecJob, ExecResult, Executor

# --- math ------------------------------------------------------------------------------------------


def _parse_math(text: str) -> list[Any]:
    from math_verify import parse

    # currency "\$" and thin spaces "\!" are typography, not maths (MATH writes "\$32,\!348")
    text = text.replace("\\$", "").replace("\\!", "").strip()
    if not text:
        return []
    if "$" not in text and "\\boxed" not in text and "\\(" not in text:
        parsed = parse(f"${text}$")
        if parsed:
            return parsed
    return parse(text)


def math_equal(gold: str, predicted: str) -> bool:
    """math-verify's equivalence of a gold answer and an extracted prediction (gold first, as it asks)."""
    from math_verify import verify

    if not predicted.strip():
        return False
    g, p = _parse_math(gold), _parse_math(predicted)
    return bool(g and p and verify(g, p))


# --- program assembly ------------------------------------------------------------------------------


def defines(code: str, name: str) -> bool:
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def strip_main_guard(code: str) -> str:
    """Drop top-level ``if __name__ == "__main__":`` blocks (demo code reading stdin, printing), as
    EvalPlus's sanitizer does: function benchmarks grade the function, and the sandbox runs programs
    as ``__main__``. Code that does not parse is returned unchanged (it fails on its own)."""
    if "__main__" not in code:
        return code
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    drop: set[int] = set()
    for node in tree.body:
        test = getattr(node, "test", None)
        if (
            isinstance(node, ast.If)
            and isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name)
            and test.left.id == "__name__"
            and len(test.comparators) == 1
            and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__"
        ):
            drop.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    if not drop:
        return code
    return "\n".join(line for i, line in enumerate(code.splitlines(), start=1) if i not in drop) + "\n"


def assemble(prompt: str, code: str, entry_point: str) -> str:
    """A whole program from a function prompt and a completion: a full function, or only its body."""
    if defines(code, entry_point):
        return f"{prompt}\n{strip_main_guard(code)}\n"
    return f"{prompt}{code}\n"


# --- job builders ----------------------------------------------------------------------------------

PASS_FN = "__populora_test"


def assert_job(program: str, setup: str, test: str, timeout_s: float) -> ExecJob:
    """One assert in its own job; ``expr`` runs it, so a program that exits early does not pass."""
    body = "\n".join("    " + line for line in test.strip().splitlines())
    code = f"{program}\n{setup}\ndef {PASS_FN}():\n{body}\n    return True\n"
    return ExecJob(code=code, expr=f"{PASS_FN}()", timeout_s=timeout_s)


def check_job(program: str, test: str, entry_point: str, timeout_s: float) -> ExecJob:
    """HumanEval's ``check(candidate)`` (its tests are one function) as one job."""
    code = f"{program}\n{test}\ndef {PASS_FN}():\n    check({entry_point})\n    return True\n"
    return ExecJob(code=code, expr=f"{PASS_FN}()", timeout_s=timeout_s)


def passed(result: ExecResult) -> bool:
    return result.ok and result.value == "True"


# The harness runs inside the sandbox. It execs the candidate (and, for EvalPlus, the ground truth)
# in their own namespaces, gives each test its own interval timer and stops at the first failure.
HARNESS = r"""
import copy as _copy
import io as _io
import json as _json
import math as _math
import os as _os
import sys as _sys
from decimal import Decimal as _Decimal, InvalidOperation as _InvalidOperation

class _TestTimeout(BaseException):
    pass

# A timer per test: SIGALRM where the sandbox lets programs import signal, else a watchdog thread
# that interrupts the main thread (both take effect between bytecodes, like any Python timeout).
try:
    import signal as _signal

    def _on_alarm(signum, frame):
        raise _TestTimeout()

    _signal.signal(_signal.SIGALRM, _on_alarm)
    _TIMER = "signal"
except Exception:
    try:
        import _thread
        import threading as _threading
        _TIMER = "thread"
    except Exception:
        _TIMER = None

def _timed(fn, seconds):
    if _TIMER == "signal":
        _signal.setitimer(_signal.ITIMER_REAL, seconds)
        try:
            return fn()
        finally:
            _signal.setitimer(_signal.ITIMER_REAL, 0)
    if _TIMER != "thread":
        return fn()
    fired = []

    def _fire():
        fired.append(True)
        _thread.interrupt_main()

    timer = _threading.Timer(seconds, _fire)
    timer.daemon = True
    timer.start()
    try:
        try:
            result = fn()
        finally:
            timer.cancel()
            timer.join()
            if fired:
                for _ in range(10000):  # let a pending interrupt land here, not in later code
                    pass
    except KeyboardInterrupt:
        raise _TestTimeout() from None
    if fired:
        raise _TestTimeout()
    return result

def _dec(x):
    # inputs keep their Python types through JSON: tagged tuples, sets, complex numbers, long ints, dicts
    if isinstance(x, list):
        return [_dec(v) for v in x]
    if isinstance(x, dict):
        (tag, v), = x.items()
        if tag == "t":
            return tuple(_dec(i) for i in v)
        if tag == "s":
            return set(_dec(i) for i in v)
        if tag == "fs":
            return frozenset(_dec(i) for i in v)
        if tag == "c":
            return complex(_dec(v[0]), _dec(v[1]))
        if tag == "f":
            return float(v)
        if tag == "i":
            return int(v, 16)
        if tag == "d":
            return {_dec(k): _dec(i) for k, i in v}
        if tag == "b":
            return bytes.fromhex(v)
        raise ValueError("unknown tag " + tag)
    return x

def _is_floats(x):
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return False

def _close(out, exp, atol):
    # numpy.allclose(out, exp, rtol=1e-7, atol=atol) without numpy, element by element
    if isinstance(exp, (list, tuple)):
        if not isinstance(out, (list, tuple)) or len(out) != len(exp):
            return False
        return all(_close(o, e, atol) for o, e in zip(out, exp))
    if not isinstance(out, (int, float, complex)) or not isinstance(exp, (int, float, complex)):
        return False
    if isinstance(out, complex) or isinstance(exp, complex):
        return abs(out - exp) <= atol + 1e-7 * abs(exp)
    if _math.isnan(exp) or _math.isnan(out):
        return _math.isnan(exp) and _math.isnan(out)
    if _math.isinf(exp) or _math.isinf(out):
        return out == exp
    return abs(out - exp) <= atol + 1e-7 * abs(exp)

def _surface_area_oracle(base_edge, height):
    # Mbpp/581: EvalPlus also accepts the reading where "height" is the pyramid's perpendicular height
    slant = _math.sqrt((base_edge / 2) ** 2 + height ** 2)
    return round(base_edge ** 2 + 2 * base_edge * slant)

def _digit_distance_oracle(a, b):
    # Mbpp/558: EvalPlus also accepts the reading where the shorter number is padded with zeros
    x, y = str(a), str(b)
    width = max(len(x), len(y))
    return sum(abs(int(p) - int(q)) for p, q in zip(x.zfill(width), y.zfill(width)))

_SET_EQ = frozenset(("similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly",
                     "larg_nnum", "intersection_array", "find_dissimilar", "Diff"))
_NOT_NONE = frozenset(("check_str", "text_match_three", "text_starta_endb"))

def _same(out, exp, atol, entry_point="", inp=(), mbpp=False):
    # EvalPlus's verdict for one output: exact, or its per-task oracle, or allclose under atol
    try:
        exact = bool(out == exp)
    except Exception:
        exact = False
    try:
        if mbpp:
            if entry_point == "are_equivalent":
                exact = True
            elif entry_point == "sum_div":
                exact = exact or out == 0
            elif entry_point == "surface_Area":
                exact = exact or abs(out - _surface_area_oracle(*inp)) <= atol
            elif entry_point == "digit_distance_nums":
                exact = exact or out == _digit_distance_oracle(*inp)
            elif entry_point in _SET_EQ:
                exact = set(out) == set(exp)
            elif entry_point in _NOT_NONE:
                exact = (out == exp) if isinstance(out, bool) else (exp == (out is not None))
        if atol == 0 and _is_floats(exp):
            atol = 1e-6
        if exact or atol == 0:
            return exact
        if type(out) is not type(exp):
            return False
        return _close(out, exp, atol)
    except Exception:
        return False

def _poly(xs, x):
    return sum(c * x ** i for i, c in enumerate(xs))

def _load(src, name):
    ns = {"__name__": name}
    exec(compile(src, "<" + name + ">", "exec"), ns)
    return ns

def _evalplus(spec):
    entry, mbpp = spec["entry_point"], spec["mbpp"]
    try:
        gold = _load(spec["gold"], "gold")[entry]
    except BaseException as exc:
        return (0, "gold: load: " + type(exc).__name__ + ": " + str(exc)[:200])
    try:
        cand = _timed(lambda: _load(spec["program"], "solution"), spec["timeout"])[entry]
    except _TestTimeout:
        return (0, "timeout while loading the program")
    except BaseException as exc:
        return (0, "load: " + type(exc).__name__ + ": " + str(exc)[:200])
    n = 0
    for inp in _dec(spec["inputs"]):
        try:
            exp = _timed(lambda: gold(*_copy.deepcopy(inp)), spec["gold_timeout"])
        except BaseException as exc:
            return (n, "gold: " + type(exc).__name__ + ": " + str(exc)[:200])
        if mbpp and entry in _NOT_NONE:
            exp = exp is not None  # EvalPlus's expected output for these tasks: "not None"
        try:
            out = _timed(lambda: cand(*_copy.deepcopy(inp)), spec["timeout"])
        except _TestTimeout:
            return (n, "timeout")
        except BaseException as exc:
            return (n, type(exc).__name__ + ": " + str(exc)[:200])
        if entry == "find_zero" and not mbpp:
            try:
                ok = abs(_poly(inp[0], out)) <= (spec["atol"] or 1e-6)
            except Exception:
                ok = False
        else:
            ok = _same(out, exp, spec["atol"], entry, inp, mbpp)
        if not ok:
            return (n, "wrong answer")
        n += 1
    return (n, "")

def _run_stdin(code, data, seconds):
    raw = data.encode()
    out_buf = _io.BytesIO()
    fake_out = _io.TextIOWrapper(out_buf, encoding="utf-8", write_through=True)
    saved = (_sys.stdin, _sys.stdout, _os.dup(0))
    try:
        fd = _os.memfd_create("stdin")
        _os.write(fd, raw)
        _os.lseek(fd, 0, 0)
        _os.dup2(fd, 0)
        _os.close(fd)
        _sys.stdin = open(0, "r", closefd=False)
    except Exception:
        _sys.stdin = _io.TextIOWrapper(_io.BytesIO(raw), encoding="utf-8")
    _sys.stdout = fake_out
    try:
        _timed(lambda: exec(code, {"__name__": "__main__"}), seconds)
    except SystemExit:
        pass
    finally:
        fake_out.flush()
        _sys.stdin, _sys.stdout = saved[0], saved[1]
        _os.dup2(saved[2], 0)
        _os.close(saved[2])
    return out_buf.getvalue().decode("utf-8", "replace")

def _tokens_equal(a, b):
    if a == b:
        return True
    try:
        return _Decimal(a) == _Decimal(b)
    except (_InvalidOperation, ValueError):
        return False

def _stdout_equal(out, exp):
    lo = [l.strip() for l in out.strip().splitlines()]
    le = [l.strip() for l in exp.strip().splitlines()]
    if lo == le:
        return True
    if len(lo) != len(le):
        return False
    for x, y in zip(lo, le):
        tx, ty = x.split(), y.split()
        if len(tx) != len(ty) or not all(_tokens_equal(p, q) for p, q in zip(tx, ty)):
            return False
    return True

def _listify(x):
    if isinstance(x, (list, tuple)):
        return [_listify(i) for i in x]
    if isinstance(x, dict):
        return {k: _listify(v) for k, v in x.items()}
    return x

def _lcb(spec):
    n = 0
    try:
        code = compile(spec["header"] + spec["program"], "<solution>", "exec")
        if spec["func_name"] and any(t["testtype"] == "functional" for t in spec["tests"]):
            ns = _timed(lambda: _load(spec["header"] + spec["program"], "solution"), spec["timeout"])
        else:
            ns = None
    except _TestTimeout:
        return (0, "timeout while loading the program")
    except BaseException as exc:
        return (0, "load: " + type(exc).__name__ + ": " + str(exc)[:200])
    for t in spec["tests"]:
        try:
            if t["testtype"] == "functional":
                args = [_json.loads(line) for line in t["input"].split("\n") if line.strip()]
                exp = _json.loads(t["output"])
                holder = ns.get("Solution")
                fn = getattr(holder(), spec["func_name"]) if holder is not None else ns[spec["func_name"]]
                out = _timed(lambda: fn(*args), spec["timeout"])
                ok = _listify(out) == _listify(exp)
            else:
                out = _run_stdin(code, t["input"], spec["timeout"])
                ok = _stdout_equal(out, t["output"])
        except _TestTimeout:
            return (n, "timeout")
        except BaseException as exc:
            return (n, type(exc).__name__ + ": " + str(exc)[:200])
        if not ok:
            return (n, "wrong answer")
        n += 1
    return (n, "")
"""

#: What LiveCodeBench puts before every program, stdin and functional alike (lcb_runner's
#: ``import_string``): these modules star-imported, then imported by name, and a recursion limit of 50,000.
LCB_PREAMBLE_MODULES = (
    "string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random", "statistics",
    "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing",
)  # fmt: skip


def lcb_preamble() -> str:
    """LiveCodeBench's preamble; a module the sandbox does not allow is left out, not fatal."""
    star = [f"from {m} import *" for m in LCB_PREAMBLE_MODULES]
    plain = [f"import {m}" for m in LCB_PREAMBLE_MODULES if m not in ("builtins", "typing")]
    guarded = "".join(f"try:\n    {line}\nexcept Exception:\n    pass\n" for line in [*star, *plain])
    return guarded + "try:\n    sys.setrecursionlimit(50000)\nexcept Exception:\n    pass\n"


LCB_HEADER = lcb_preamble()


def encode_value(value: Any) -> Any:
    """A Python value as JSON the harness turns back into the same value (``_dec``).

    Tuples, sets, frozensets, complex numbers, non-finite floats, dicts (any keys), bytes and integers
    of any length (as hex: no 4,300-digit limit) keep their types, as EvalPlus passes inputs.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return {"i": format(value, "x")} if value.bit_length() > 64 else value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"f": repr(value)}
    if isinstance(value, complex):
        return {"c": [encode_value(value.real), encode_value(value.imag)]}
    if isinstance(value, list):
        return [encode_value(v) for v in value]
    if isinstance(value, tuple):
        return {"t": [encode_value(v) for v in value]}
    if isinstance(value, frozenset):
        return {"fs": [encode_value(v) for v in value]}
    if isinstance(value, set):
        return {"s": [encode_value(v) for v in value]}
    if isinstance(value, dict):
        return {"d": [[encode_value(k), encode_value(v)] for k, v in value.items()]}
    if isinstance(value, bytes):
        return {"b": value.hex()}
    raise TypeError(f"an input of type {type(value).__name__} cannot be passed to the sandbox")


def evalplus_job(
    program: str, gold: str, entry_point: str, inputs: list[Any], atol: float, timeout_s: float, mbpp: bool = False
) -> ExecJob:
    """Candidate and ground truth on ``inputs`` (any Python values), compared as EvalPlus compares them.

    ``mbpp``: apply EvalPlus's MBPP+ special cases by entry point (set comparison, ``re.Match`` as
    not-None, the second oracles of Mbpp/581 and Mbpp/558, Mbpp/164 and Mbpp/295).
    """
    spec = {
        "program": program,
        "gold": gold,
        "entry_point": entry_point,
        "mbpp": mbpp,
        "inputs": encode_value(list(inputs)),
        "atol": atol,
        "timeout": timeout_s,
        "gold_timeout": max(timeout_s, 10.0),
    }
    code = f"{HARNESS}\n__populora_spec = _json.loads({json.dumps(spec)!r})\n"
    return ExecJob(code=code, expr="_evalplus(__populora_spec)", timeout_s=(timeout_s + 1.0) * len(inputs) + 5.0)


def lcb_job(program: str, tests: list[dict[str, Any]], func_name: str | None, timeout_s: float) -> ExecJob:
    spec = {"program": program, "tests": tests, "func_name": func_name, "timeout": timeout_s, "header": LCB_HEADER}
    code = f"{HARNESS}\n__populora_spec = _json.loads({json.dumps(spec)!r})\n"
    return ExecJob(code=code, expr="_lcb(__populora_spec)", timeout_s=timeout_s * len(tests) + 5.0)


@dataclass
class ChunkOutcome:
    passed: int
    message: str


def chunk_outcome(result: ExecResult, total: int) -> ChunkOutcome:
    """Decode a harness job's ``(tests passed, first failure)``; any sandbox failure fails the chunk."""
    if not result.ok or result.value is None:
        return ChunkOutcome(0, f"{result.status}: {result.error or ''}"[:300])
    try:
        n, msg = ast.literal_eval(result.value)
        return ChunkOutcome(int(n), str(msg))
    except (ValueError, SyntaxError, TypeError):
        return ChunkOutcome(0, f"unreadable harness result {result.value[:100]!r}")


def chunks(seq: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(seq[i : i + size]) for i in range(0, len(seq), size)] or [[]]


def run_jobs(executor: Executor, jobs: list[ExecJob]) -> list[ExecResult]:
    if not jobs:
        return []
    results = executor.run_batch(jobs)
    if len(results) != len(jobs):
        raise RuntimeError(f"executor returned {len(results)} results for {len(jobs)} jobs")
    return results
