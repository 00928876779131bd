"""Synthetic AZR-style corpus: random small typed programs, run in the sandbox, rendered as compact prompts.

A program is a chain of 1-3 typed steps over ``int``/``str``/``list``/``dict`` values (a grammar of
89 templates with random constants, a few with loops and branches), optionally with a second
``int`` argument ``k`` standing in for one constant. Every candidate input is run in the sandbox
executor twice, in two hash-seed families, through the AZR task's own value check (two calls per
process, plain literal output, repr round trip); inputs that raise, disagree or give ``None`` are
dropped, and a program with too few surviving inputs is dropped. The rendered examples use the
``compact`` builders of ``populora_azr.prompts`` verbatim, so the model sees exactly the loop's prompts.

Everything is drawn from ``random.Random(seed)``: the same seed gives the same programs, inputs and
examples.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

TYPES = ("int", "str", "list", "dict")
ARG_NAME = {"int": "n", "str": "s", "list": "xs", "dict": "d"}
LETTERS = "abcde"

#: Shown to the solver in induction problems when the proposer wrote nothing better.
IDENTITY_SEED = ("def f(a):\n    return a", "'Hello world'", "'Hello world'")


@dataclass(frozen=True)
class Op:
    """One typed step: ``render(var, rng) -> (lines, expr_or_None, uses_k)``."""

    src: str
    dst: str
    hint: str
    render: Callable[[str, str, random.Random, bool], tuple[list[str], str]]
    loop: bool = False


def _expr(template: str, consts: Callable[[random.Random], dict[str, Any]] | None = None, k_slot: str | None = None):
    """An expression op: ``template`` with ``{x}`` the input variable and named random constants.

    ``k_slot`` names the integer constant that the second argument ``k`` may replace.
    """

    def render(x: str, dst: str, rng: random.Random, use_k: bool) -> tuple[list[str], str]:
        values = consts(rng) if consts else {}
        if use_k and k_slot:
            values[k_slot] = "k"
        return [], template.format(x=x, **values)

    return render


def _loop(
    body: str, result: str, consts: Callable[[random.Random], dict[str, Any]] | None = None, k_slot: str | None = None
):
    """A statement op: ``body`` lines (``{x}`` input, ``{r}`` the result variable ``result``)."""

    def render(x: str, dst: str, rng: random.Random, use_k: bool) -> tuple[list[str], str]:
        values = consts(rng) if consts else {}
        if use_k and k_slot:
            values[k_slot] = "k"
        lines = body.format(x=x, r=result, **values).split("\n")
        return lines, result

    return render


def _c(lo: int, hi: int, name: str = "c"):
    return lambda rng: {name: rng.randint(lo, hi)}


def _letter(*names: str):
    def draw(rng: random.Random) -> dict[str, Any]:
        picks = rng.sample(LETTERS, len(names))
        return dict(zip(names, picks, strict=True))

    return draw


def _word(rng: random.Random) -> dict[str, Any]:
    return {"w": "".join(rng.choice(LETTERS + "xyz") for _ in range(rng.randint(1, 3)))}


def _both(*draws):
    def draw(rng: random.Random) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for d in draws:
            out.update(d(rng))
        return out

    return draw


E, L = _expr, _loop

OPS: list[Op] = [
    # int -> int
    Op("int", "int", "add a number", E("{x} + {c}", _c(1, 9), "c")),
    Op("int", "int", "subtract a number", E("{x} - {c}", _c(1, 9), "c")),
    Op("int", "int", "multiply by a number", E("{x} * {c}", _c(2, 5), "c")),
    Op("int", "int", "integer-divide by a number", E("{x} // {c}", _c(2, 5))),
    Op("int", "int", "take the remainder", E("{x} % {c}", _c(2, 7))),
    Op("int", "int", "take the absolute value", E("abs({x})")),
    Op("int", "int", "negate", E("-{x}")),
    Op("int", "int", "square", E("{x} * {x}")),
    Op("int", "int", "clip from below", E("max({x}, {c})", _c(0, 6), "c")),
    Op("int", "int", "clip from above", E("min({x}, {c})", _c(3, 12), "c")),
    Op("int", "int", "branch on the size", E("{x} * 2 if {x} > {c} else {x} + 1", _c(0, 8), "c")),
    Op(
        "int",
        "int",
        "sum the digits",
        L("{r} = 0\nm = abs({x})\nwhile m > 0:\n    {r} += m % 10\n    m //= 10", "total"),
        loop=True,
    ),
    Op(
        "int",
        "int",
        "count up with a step",
        L("{r} = 0\nfor i in range({x} % 7):\n    {r} += i * {c}", "total", _c(1, 3), "c"),
        loop=True,
    ),
    # int -> str
    Op("int", "str", "write it as text", E("str({x})")),
    Op("int", "str", "repeat a letter", E("'{a}' * ({x} % 5)", _letter("a"))),
    Op("int", "str", "write it twice", E("str({x}) * 2")),
    # int -> list
    Op("int", "list", "count from zero", E("list(range({x} % 6))")),
    Op("int", "list", "repeat it", E("[{x}] * {c}", _c(1, 3), "c")),
    Op("int", "list", "make a short list", E("[{x}, {x} + {c}, {x} * 2]", _c(1, 5), "c")),
    Op("int", "list", "list multiples", E("[i * {x} for i in range({c})]", _c(2, 4))),
    # str -> str
    Op("str", "str", "upper-case", E("{x}.upper()")),
    Op("str", "str", "reverse", E("{x}[::-1]")),
    Op("str", "str", "append text", E("{x} + '{w}'", _word)),
    Op("str", "str", "prepend text", E("'{w}' + {x}", _word)),
    Op("str", "str", "double the text", E("{x} * 2")),
    Op("str", "str", "replace a letter", E("{x}.replace('{a}', '{b}')", _letter("a", "b"))),
    Op("str", "str", "drop the first letter", E("{x}[1:]")),
    Op("str", "str", "keep the first letters", E("{x}[:{c}]", _c(1, 4), "c")),
    Op("str", "str", "sort the letters", E("''.join(sorted({x}))")),
    Op("str", "str", "swap the case", E("{x}.swapcase()")),
    Op("str", "str", "capitalize", E("{x}.capitalize()")),
    Op("str", "str", "join the letters with dashes", E("'-'.join({x})")),
    Op("str", "str", "keep every other letter", E("{x}[::2]")),
    Op("str", "str", "remove a letter", E("{x}.replace('{a}', '')", _letter("a"))),
    Op(
        "str",
        "str",
        "upper-case some letters",
        L(
            "{r} = ''\nfor ch in {x}:\n    if ch in '{a}{b}':\n        {r} += ch.upper()\n    else:\n        {r} += ch",
            "out",
            _letter("a", "b"),
        ),
        loop=True,
    ),
    Op(
        "str",
        "str",
        "double some letters",
        L("{r} = ''\nfor ch in {x}:\n    {r} += ch * 2 if ch < '{a}' else ch", "out", _letter("a")),
        loop=True,
    ),
    # str -> int
    Op("str", "int", "take the length", E("len({x})")),
    Op("str", "int", "count a letter", E("{x}.count('{a}')", _letter("a"))),
    Op("str", "int", "find a letter", E("{x}.find('{a}')", _letter("a"))),
    Op("str", "int", "count distinct letters", E("len(set({x}))")),
    Op("str", "int", "add the letter positions", E("sum(ord(ch) - 96 for ch in {x})")),
    Op(
        "str",
        "int",
        "sum the positions of a letter",
        L("{r} = 0\nfor i, ch in enumerate({x}):\n    if ch == '{a}':\n        {r} += i", "total", _letter("a")),
        loop=True,
    ),
    # str -> list
    Op("str", "list", "list the letter positions", E("[ord(ch) - 96 for ch in {x}]")),
    Op("str", "list", "split on a letter", E("{x}.split('{a}')", _letter("a"))),
    Op("str", "list", "list the distinct letters", E("sorted(set({x}))")),
    Op("str", "list", "list the letters", E("list({x})")),
    # str -> dict
    Op("str", "dict", "count each letter", E("{{ch: {x}.count(ch) for ch in {x}}}")),
    # list -> list
    Op("list", "list", "sort", E("sorted({x})")),
    Op("list", "list", "sort descending", E("sorted({x}, reverse=True)")),
    Op("list", "list", "reverse", E("{x}[::-1]")),
    Op("list", "list", "add a number to each", E("[v + {c} for v in {x}]", _c(1, 9), "c")),
    Op("list", "list", "multiply each", E("[v * {c} for v in {x}]", _c(2, 4), "c")),
    Op("list", "list", "keep the large ones", E("[v for v in {x} if v > {c}]", _c(0, 6), "c")),
    Op("list", "list", "keep the even ones", E("[v for v in {x} if v % 2 == 0]")),
    Op("list", "list", "keep the odd ones", E("[v for v in {x} if v % 2 == 1]")),
    Op("list", "list", "append a number", E("{x} + [{c}]", _c(0, 9), "c")),
    Op("list", "list", "drop the first item", E("{x}[1:]")),
    Op("list", "list", "keep the first items", E("{x}[:{c}]", _c(1, 3), "c")),
    Op("list", "list", "take remainders", E("[v % {c} for v in {x}]", _c(2, 5), "c")),
    Op("list", "list", "add neighbours", E("[{x}[i] + {x}[i - 1] for i in range(1, len({x}))]")),
    Op(
        "list",
        "list",
        "halve evens and grow odds",
        L(
            "{r} = []\nfor v in {x}:\n    if v % 2 == 0:\n        {r}.append(v // 2)\n"
            "    else:\n        {r}.append(v * 3 + 1)",
            "res",
        ),
        loop=True,
    ),
    Op(
        "list",
        "list",
        "running total",
        L("{r} = []\nacc = 0\nfor v in {x}:\n    acc += v\n    {r}.append(acc)", "res"),
        loop=True,
    ),
    # list -> int
    Op("list", "int", "sum", E("sum({x})")),
    Op("list", "int", "count the items", E("len({x})")),
    Op("list", "int", "take the largest", E("max({x}, default={c})", _c(0, 3))),
    Op("list", "int", "take the smallest", E("min({x}, default={c})", _c(0, 3))),
    Op("list", "int", "count a number", E("{x}.count({c})", _c(0, 9), "c")),
    Op("list", "int", "sum the squares", E("sum(v * v for v in {x})")),
    Op("list", "int", "count the large ones", E("len([v for v in {x} if v > {c}])", _c(0, 6), "c")),
    Op(
        "list",
        "int",
        "score the items",
        L(
            "{r} = 0\nfor v in {x}:\n    if v > {c}:\n        {r} += v\n    else:\n        {r} -= 1",
            "total",
            _c(0, 6),
            "c",
        ),
        loop=True,
    ),
    # list -> str
    Op("list", "str", "join the digits", E("''.join(str(v) for v in {x})")),
    Op("list", "str", "join with dashes", E("'-'.join(str(v) for v in {x})")),
    Op("list", "str", "map numbers to letters", E("''.join(chr(97 + v % 26) for v in {x})")),
    # list -> dict
    Op("list", "dict", "map each to a multiple", E("{{v: v * {c} for v in {x}}}", _c(2, 4))),
    Op("list", "dict", "index the items", E("{{str(i): v for i, v in enumerate({x})}}")),
    Op(
        "list",
        "dict",
        "count remainders",
        L("{r} = {{}}\nfor v in {x}:\n    {r}[v % {c}] = {r}.get(v % {c}, 0) + 1", "counts", _c(2, 4)),
        loop=True,
    ),
    # dict -> int
    Op("dict", "int", "sum the values", E("sum({x}.values())")),
    Op("dict", "int", "count the keys", E("len({x})")),
    Op("dict", "int", "look up a key", E("{x}.get('{a}', {c})", _both(_letter("a"), _c(0, 9)), "c")),
    Op("dict", "int", "take the largest value", E("max({x}.values(), default=0)")),
    # dict -> list
    Op("dict", "list", "list the keys", E("sorted({x})")),
    Op("dict", "list", "list the values", E("sorted({x}.values())")),
    Op("dict", "list", "keys with large values", E("[q for q in sorted({x}) if {x}[q] > {c}]", _c(0, 6), "c")),
    Op("dict", "list", "list the pairs", E("sorted({x}.items())")),
    # dict -> dict
    Op("dict", "dict", "add to each value", E("{{q: v + {c} for q, v in {x}.items()}}", _c(1, 9), "c")),
    Op("dict", "dict", "keep even values", E("{{q: v for q, v in {x}.items() if v % 2 == 0}}")),
    Op("dict", "dict", "swap keys and values", E("{{v: q for q, v in {x}.items()}}")),
    # dict -> str
    Op("dict", "str", "join the keys", E("''.join(sorted({x}))")),
    Op("dict", "str", "spell out the counts", E("''.join(q * v for q, v in sorted({x}.items()))")),
]


@dataclass
class Program:
    """A generated program, its argument types, the hint used as an induction message."""

    code: str
    arg_types: tuple[str, ...]
    message: str
    steps: int
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


def random_program(rng: random.Random) -> Program:
    """1-3 typed steps (mostly one: the easy end); with probability 1/4 one integer constant becomes
    a second argument ``k``."""
    steps = rng.choices((1, 2, 3), weights=(6, 3, 1))[0]
    src = rng.choice(TYPES)
    use_k_at = rng.randrange(steps) if rng.random() < 0.25 else -1
    arg = ARG_NAME[src]
    var, typ = arg, src
    body: list[str] = []
    hints: list[str] = []
    used_loop = False
    ret = ""
    for i in range(steps):
        choices = [op for op in OPS if op.src == typ and not (op.loop and used_loop)]
        op = rng.choice(choices)
        used_loop |= op.loop
        use_k = i == use_k_at
        lines, expr = op.render(var, ARG_NAME[op.dst], rng, use_k)
        hints.append(op.hint)
        last = i == steps - 1
        if op.loop:
            body.extend(lines)
            if last:
                ret = expr
            var = expr
        elif last:
            ret = expr
        else:
            dst = ARG_NAME[op.dst]
            body.append(f"{dst} = {expr}")
            var = dst
        typ = op.dst
    lines = [*("    " + ln for ln in body), f"    return {ret}"]
    k_used = "k" in _names_in("\n".join(ln[4:] for ln in lines))
    args = [arg] + (["k"] if k_used else [])
    code = "\n".join([f"def f({', '.join(args)}):", *lines])
    types = (src, "int") if k_used else (src,)
    return Program(code, types, ", then ".join(hints), steps)


def _names_in(text: str) -> set[str]:
    try:
        tree = ast.parse(text.strip())
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def random_value(typ: str, rng: random.Random) -> Any:
    """Small values, so outputs stay short and the easy end (empty, 0, one letter) appears often."""
    if typ == "int":
        return rng.choice((rng.randint(0, 9), rng.randint(0, 9), rng.randint(-5, 20)))
    if typ == "str":
        alphabet = LETTERS if rng.random() < 0.7 else LETTERS + "xyz"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5)))
    if typ == "list":
        return [rng.randint(0, 9) for _ in range(rng.randint(0, 5))]
    if typ == "dict":
        keys = rng.sample(LETTERS, rng.randint(1, 3))
        return {q: rng.randint(0, 9) for q in keys}
    raise ValueError(f"unknown type {typ!r}")


def random_input(types: Sequence[str], rng: random.Random) -> str:
    """The call's argument text, as the prompts show it (``repr`` of each argument, comma-separated)."""
    values = [random_value(t, rng) if i == 0 else rng.randint(0, 5) for i, t in enumerate(types)]
    return ", ".join(repr(v) for v in values)


# --- running in the sandbox -----------------------------------------------------------------------------

#: Evaluates every input of one program in one sandbox process through the AZR value check.
_ALL_HELPER = """

def _populora_nano_all(thunks):
    out = []
    for thunk in thunks:
        try:
            out.append(repr(_populora_value(thunk)))
        except Exception:
            out.append(None)
    return out
"""


def execute(
    programs: Sequence[Program],
    candidates: Sequence[Sequence[str]],
    executor: Any,
    *,
    max_output_chars: int = 80,
    timeout_s: float = 5.0,
) -> None:
    """Fill ``program.inputs``/``outputs`` with the candidates that run cleanly and deterministically.

    Each program runs in two fresh processes of different hash-seed families (``hash_variant`` 0 and
    1); an input survives when both agree, the AZR value check passes, the output is not ``None`` and
    its repr is at most ``max_output_chars`` characters. Duplicate inputs are dropped.
    """
    from populora_azr.sandbox_code import FIXED_HELPERS

    from populora_core.api.components import ExecJob

    jobs = []
    for prog, cands in zip(programs, candidates, strict=True):
        code = prog.code + "\n" + FIXED_HELPERS + _ALL_HELPER
        expr = "_populora_nano_all([" + ", ".join(f"lambda: f({c})" for c in cands) + "])"
        jobs += [ExecJob(code, expr, timeout_s=timeout_s, hash_variant=v) for v in (0, 1)]
    results = executor.run_batch(jobs)
    for i, (prog, cands) in enumerate(zip(programs, candidates, strict=True)):
        a, b = results[2 * i], results[2 * i + 1]
        prog.inputs, prog.outputs = [], []
        if not (a.ok and b.ok) or a.value != b.value:
            continue
        values = ast.literal_eval(a.value or "[]")
        seen = set()
        for cand, val in zip(cands, values, strict=True):
            if val is None or val == "None" or len(val) > max_output_chars or cand in seen:
                continue
            seen.add(cand)
            prog.inputs.append(cand)
            prog.outputs.append(val)


def generate_programs(
    count: int,
    rng: random.Random,
    executor: Any,
    *,
    candidates: int = 14,
    min_inputs: int = 10,
    exclude: Collection[str] = frozenset(),
    chunk: int = 500,
) -> list[Program]:
    """``count`` distinct programs (code not in ``exclude``) with at least ``min_inputs`` valid inputs."""
    out: list[Program] = []
    seen = set(exclude)
    while len(out) < count:
        batch: list[Program] = []
        cands: list[list[str]] = []
        while len(batch) < chunk:
            prog = random_program(rng)
            if prog.code in seen:
                continue
            seen.add(prog.code)
            batch.append(prog)
            cands.append([random_input(prog.arg_types, rng) for _ in range(candidates)])
        execute(batch, cands, executor)
        for prog in batch:
            if len(prog.inputs) >= min_inputs and len(set(prog.outputs)) >= 2 and len(out) < count:
                out.append(prog)
    return out


# --- rendering ----------------------------------------------------------------------------------------------


@dataclass
class Example:
    """One training example: ``prompt`` then ``completion`` (the model learns the completion)."""

    kind: str  # e.g. "deduction/solve", "induction/propose"
    prompt: str
    completion: str


def pick_inputs(prog: Program, n: int, rng: random.Random) -> list[int]:
    """``n`` input indices, preferring inputs with distinct outputs (more revealing pairs)."""
    idx = list(range(len(prog.inputs)))
    rng.shuffle(idx)
    first: list[int] = []
    rest: list[int] = []
    seen = set()
    for i in idx:
        (rest if prog.outputs[i] in seen else first).append(i)
        seen.add(prog.outputs[i])
    return (first + rest)[:n]


def render_examples(
    programs: Sequence[Program],
    rng: random.Random,
    *,
    induction_sizes: Sequence[int] = (4, 6, 8, 10),
    induction_propose_rate: float = 0.3,
) -> list[Example]:
    """Solver- and proposer-side examples for all three task types, in the compact style.

    ``induction_propose_rate`` is the share of programs that also get an induction proposal (inputs and
    a message): a teacher's message is what makes its induction problems solvable.
    """
    from populora_azr import prompts as P

    out: list[Example] = []
    for prog in programs:
        for i in pick_inputs(prog, 2, rng):
            out.append(
                Example(
                    "deduction/solve",
                    P.deduction_solver_prompt(prog.code, prog.inputs[i]),
                    P.format_solver_answer("deduction", prog.outputs[i]),
                )
            )
        for i in pick_inputs(prog, 2, rng):
            out.append(
                Example(
                    "abduction/solve",
                    P.abduction_solver_prompt(prog.code, prog.outputs[i]),
                    P.format_solver_answer("abduction", prog.inputs[i]),
                )
            )
        n = rng.choice([s for s in induction_sizes if s <= len(prog.inputs)])
        chosen = pick_inputs(prog, n, rng)
        pairs = [(prog.inputs[i], prog.outputs[i]) for i in chosen]
        out.append(
            Example(
                "induction/solve",
                P.induction_solver_prompt(pairs[: n // 2], prog.message),
                P.format_solver_answer("induction", prog.code),
            )
        )
        if rng.random() < induction_propose_rate:
            out.append(
                Example(
                    "induction/propose",
                    P.induction_proposer_prompt(prog.code, n_inputs=n),
                    P.format_induction_proposal([prog.inputs[i] for i in chosen], prog.message),
                )
            )
        if rng.random() < 0.4:
            kind = rng.choice(("deduction", "abduction"))
            refs = [IDENTITY_SEED] if rng.random() < 0.2 else []
            for other in rng.sample(list(programs), rng.randint(0, 5)):
                j = rng.randrange(len(other.inputs))
                refs.append((other.code, other.inputs[j], other.outputs[j]))
            if not refs:
                refs = [IDENTITY_SEED]
            i = rng.randrange(len(prog.inputs))
            out.append(
                Example(
                    f"{kind}/propose",
                    # the shipped model was trained on the pre-issue-32 prompts (references beyond 600 chars skipped)
                    P.code_proposer_prompt(kind, refs, max_chars=P.COMPACT_MAX_CHARS),
                    P.format_code_proposal(prog.code, prog.inputs[i]),
                )
            )
    rng.shuffle(out)
    return out


def probe_records(
    programs: Sequence[Program], per_type: int, rng: random.Random, n_inputs: int = 10
) -> list[dict[str, Any]]:
    """Held-out problems as :class:`~populora_core.api.components.Problem` fields, ``per_type`` per task.

    Deduction/abduction: one input and its output. Induction: ``n_inputs`` pairs (the task shows the
    first half and grades on the second) with the program's hint as the message.
    """
    if len(programs) < 3 * per_type:
        raise ValueError(f"need {3 * per_type} probe programs, got {len(programs)}")
    recs = []
    for t, task in enumerate(("deduction", "abduction", "induction")):
        for prog in programs[t * per_type : (t + 1) * per_type]:
            if task == "induction":
                idx = pick_inputs(prog, n_inputs, rng)
                recs.append(
                    {
                        "task_type": task,
                        "program": prog.code,
                        "inputs": [prog.inputs[i] for i in idx],
                        "outputs": [prog.outputs[i] for i in idx],
                        "message": prog.message,
                    }
                )
            else:
                i = rng.randrange(len(prog.inputs))
                recs.append(
                    {
                        "task_type": task,
                        "program": prog.code,
                        "inputs": [prog.inputs[i]],
                        "outputs": [prog.outputs[i]],
                        "message": "",
                    }
                )
    return recs
