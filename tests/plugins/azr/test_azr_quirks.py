"""AZR's released quirks (reference azr.md sections 1-3, 8-9), each pinned in both modes.

Every test shows what we do by default (``compat: fixed``) and what ``compat: azr-released`` does,
which reproduces AZR's released code, with every execution still inside the sandbox.
"""

from __future__ import annotations

import ast
import random

import pytest
from populora_azr import checks
from populora_azr import prompts as P
from populora_azr.problems import CodeProblem
from populora_azr.sandbox_code import COMPAT_TRUNCATE, azr_truncate

from tests.azr_support import build_task, build_tasks, load_seeds, shared_executor

FIXED, RELEASED = "fixed", "azr-released"


@pytest.fixture
def ex():
    return shared_executor()


def propose(task, program: str, inp: str) -> CodeProblem:
    return task.parse_proposals([P.format_code_proposal(program, inp, think="p")], [None], ["t"])[0]


def solve(task, prob: CodeProblem, *answers: str) -> list[bool]:
    kind = task.name
    return [g.correct for g in task.grade(prob, [P.format_solver_answer(kind, a, think="s") for a in answers])]


def tasks(ex, name: str, **kw):
    return build_task(name, ex, compat=FIXED, **kw), build_task(name, ex, compat=RELEASED, **kw)


# --- section 1: task semantics -----------------------------------------------------------------------------


@pytest.mark.parametrize("compat", [FIXED, RELEASED])
def test_equality_is_eval_then_plain_eq_in_both_modes(ex, compat):
    task = build_task("deduction", ex, compat=compat)
    prob = propose(task, "def f(a):\n    return [{a, a + 1}, a, a]", "1")
    assert prob.valid
    assert solve(task, prob, "[{2, 1}, 1.0, True]", "[{1, 2}, 2, 1]") == [True, False]


def test_non_literal_output_deque(ex):
    program = "from collections import deque\n\ndef f(a):\n    return deque(a)"
    fixed_ded, released_ded = tasks(ex, "deduction")
    assert "plain literal" in propose(fixed_ded, program, "[1, 2]").error  # never enters a buffer
    prob = propose(released_ded, program, "[1, 2]")
    assert prob.valid and prob.outputs == ["deque([1, 2])"]
    # AZR: even a character-identical answer is graded wrong (eval lacks the import, then eval(deque))
    assert solve(released_ded, prob, "deque([1, 2])") == [False]
    released_abd = build_task("abduction", ex, compat=RELEASED)
    prob_i = propose(released_abd, program, "[1, 2]")
    assert solve(released_abd, prob_i, "[1, 2]") == [True]  # abduction on the same program works


def test_gold_output_truncated_to_400_chars_vs_size_cap(ex):
    program = "def f(n):\n    return list(range(n))"
    fixed_ded, released_ded = tasks(ex, "deduction", max_output_chars=4000)
    full = repr(list(range(300)))
    ours = propose(fixed_ded, program, "300")
    assert ours.outputs == [full] and solve(fixed_ded, ours, full) == [True]
    theirs = propose(released_ded, program, "300")
    assert theirs.outputs == [azr_truncate(full)] and len(theirs.outputs[0]) == COMPAT_TRUNCATE + 3
    assert "..." in theirs.outputs[0]
    assert solve(released_ded, theirs, full) == [False]  # the corrupted gold makes the task unsolvable
    capped = build_task("deduction", ex, max_output_chars=1000)
    assert "longer than 1000" in propose(capped, program, "300").error  # rejected, never truncated


@pytest.mark.parametrize("compat", [FIXED, RELEASED])
def test_induction_split_and_zero_seed(ex, compat):
    task = build_task("induction", ex, compat=compat)
    [seed] = task.buffer.items
    assert len(seed.inputs) == 6 and seed.program == "def f(a):\n    return a"
    shown, hidden = task.split(seed)
    assert len(shown) == len(hidden) == 3 and hidden[0][0] == seed.inputs[3]
    assert solve(task, seed, "def f(a):\n    return a") == [True]


def test_zero_seed_outputs_are_what_the_identity_returns(ex):
    task = build_task("induction", ex)
    [seed] = task.buffer.items
    prob = task.parse_proposals(
        [P.format_induction_proposal(seed.inputs, seed.message, think="x")], [{"program": seed.program}], ["t"]
    )
    # n_inputs is 10 by default: the 6-input zero entry is not a valid proposal, only a seed
    assert "need 10" in prob[0].error
    six = build_task("induction", ex, n_inputs=6)
    prob = six.parse_proposals(
        [P.format_induction_proposal(seed.inputs, seed.message, think="x")], [{"program": seed.program}], ["t"]
    )[0]
    assert prob.valid and prob.outputs == seed.outputs


@pytest.mark.parametrize("compat", [FIXED, RELEASED])
def test_induction_answer_gets_gold_imports(ex, compat):
    task = build_task("induction", ex, compat=compat)
    program = "import math\n\ndef f(a):\n    return math.factorial(a) % 7"
    prob = task.parse_proposals(
        [P.format_induction_proposal([str(i) for i in range(10)], "mod 7", think="x")], [{"program": program}], ["t"]
    )[0]
    assert prob.valid, prob.error
    assert solve(task, prob, "def f(a):\n    return math.factorial(a) % 7") == [True]


def test_first_def_renamed_to_f(ex):
    program = "def solve(s):\n    return 'solve(' + s + ', solve'"
    fixed_ded, released_ded = tasks(ex, "deduction")
    assert propose(fixed_ded, program, "'x'").outputs == ["'solve(x, solve'"]
    # AZR's regex replace of `solve(` hits a call inside a string, not the bare word
    assert propose(released_ded, program, "'x'").outputs == ["'f(x, solve'"]


# --- f_replace_location and reject_multiple_functions (one_def) on real AZR seed programs ------------------


def _real_programs(count: int = 2) -> list[dict]:
    """The first plain AZR seed triplets (Qwen2.5-7B seeding): one ``def f``, no imports, short output."""
    rows = load_seeds("7b_seed_io.jsonl")[1:]  # line 1 is the hand-written zero triplet
    picked = [
        r
        for r in rows
        if checks.azr_def_names(r["snippet"]) == ["f"]
        and "import" not in r["snippet"]
        and "class" not in r["snippet"]
        and "input(" not in r["snippet"]
        and r["output"] not in ("None", "''")
        and len(r["output"]) < 200
    ]
    return picked[:count]


def _named(row: dict, name: str) -> str:
    """The seed's program with its function called ``name``, as a model that did not call it ``f`` wrote it."""
    return checks.rename_identifier(row["snippet"], "f", name)


RENAMED = {"not_first": "helper", "any_first": "helper", "any_last": "solve", "not_last": "solve"}


@pytest.mark.parametrize("compat", [FIXED, RELEASED])
@pytest.mark.parametrize("location", checks.F_REPLACE_LOCATIONS)
def test_f_replace_location_on_two_real_functions_without_an_f(ex, compat, location):
    """Seed B as ``helper``, then seed A as ``solve``: which one becomes ``f`` decides what A's input gives."""
    a, b = _real_programs()
    program = _named(b, "helper") + "\n\n" + _named(a, "solve")
    strict = build_task("deduction", ex, compat=compat)
    assert "2 " in propose(strict, program, a["input"]).error  # 2 functions: AZR's Qwen scripts reject
    task = build_task("deduction", ex, compat=compat, one_def=False, f_replace_location=location)
    prob = propose(task, program, a["input"])
    renamed = RENAMED[location]
    kept = "solve" if renamed == "helper" else "helper"
    assert f"def {renamed}(" not in prob.program and f"def {kept}(" in prob.program
    if renamed == "solve":  # A is f: its stored output comes back
        assert prob.valid, prob.error
        assert ast.literal_eval(prob.outputs[0]) == ast.literal_eval(a["output"])
    else:  # B is f and gets A's input
        assert not prob.valid or prob.outputs != [a["output"]]


def _with_runner_class(row: dict) -> str:
    """A real seed program wrapped as a model often writes one: a class with ``__init__``, the seed as
    ``solve``, and an entry ``f`` that uses both (AZR's regex sees four defs: __init__, run, solve, f)."""
    return (
        "class Runner:\n    def __init__(self, fn):\n        self.fn = fn\n\n"
        "    def run(self, *args, **kwargs):\n        return self.fn(*args, **kwargs)\n\n\n"
        + _named(row, "solve")
        + "\n\n\ndef f(*args, **kwargs):\n    return Runner(solve).run(*args, **kwargs)"
    )


def test_released_default_renames_a_class_init_and_any_last_keeps_it(ex):
    """AZR's default (not_first) makes a class's ``__init__`` the ``f``; its Llama / Qwen3-4B scripts
    (reject_multiple_functions=False, f_replace_location=any_last) keep the program as written."""
    [a] = _real_programs(1)
    program = _with_runner_class(a)
    assert checks.azr_def_names(program) == ["__init__", "run", "solve", "f"]
    strict = build_task("deduction", ex, compat=RELEASED)
    assert "4 function definitions" in propose(strict, program, a["input"]).error
    default = build_task("deduction", ex, compat=RELEASED, one_def=False)
    broken = propose(default, program, a["input"])
    assert "def __init__" not in broken.program and "    def f(self, fn)" in broken.program
    assert not broken.valid and "TypeError" in broken.error  # Runner(solve): the class lost its __init__
    for location in ("any_last", "any_first", "not_last"):
        task = build_task("deduction", ex, compat=RELEASED, one_def=False, f_replace_location=location)
        prob = propose(task, program, a["input"])
        assert prob.valid and prob.program == program, (location, prob.error)
        assert prob.outputs == [a["output"]]  # AZR's stored output text


def test_fixed_counts_top_level_functions_and_keeps_an_existing_f(ex):
    [a] = _real_programs(1)
    program = _with_runner_class(a)
    strict = build_task("deduction", ex)
    assert "2 top-level functions" in propose(strict, program, a["input"]).error  # solve and f
    for location in (None, "any_last"):  # None: fixed's any_first
        task = build_task("deduction", ex, one_def=False, f_replace_location=location)
        prob = propose(task, program, a["input"])
        assert prob.valid and prob.program == program, prob.error
        assert ast.literal_eval(prob.outputs[0]) == ast.literal_eval(a["output"])
    always_first = build_task("deduction", ex, one_def=False, f_replace_location="not_first")
    prob = propose(always_first, program, a["input"])  # solve -> f everywhere: Runner(f) calls itself
    assert "def solve(" not in prob.program and not prob.valid


def test_f_replace_location_defaults_are_todays_behaviour(ex):
    fixed_ded, released_ded = tasks(ex, "deduction")
    assert (fixed_ded.f_replace_location, released_ded.f_replace_location) == ("any_first", "not_first")
    with pytest.raises(Exception, match="f_replace_location"):
        build_task("deduction", ex, f_replace_location="last")


def test_one_def_rule_counts_nested_defs_and_methods(ex):
    program = (
        "class Acc:\n    def __init__(self):\n        self.t = 0\n\n"
        "def f(a):\n    def inc(x):\n        return x + 1\n    acc = Acc()\n    acc.t = inc(a)\n"
        "    return acc.t"
    )
    fixed_ded, released_ded = tasks(ex, "deduction")
    assert propose(fixed_ded, program, "1").outputs == ["2"]
    assert "3 function definitions" in propose(released_ded, program, "1").error
    assert "2 top-level" in propose(fixed_ded, "def f(a):\n    return a\n\ndef g(a):\n    return a", "1").error
    relaxed = build_task("deduction", ex, one_def=False)
    assert propose(relaxed, "def f(a):\n    return g(a)\n\ndef g(a):\n    return a", "1").valid


@pytest.mark.parametrize("compat", [FIXED, RELEASED])
def test_parsed_inside_last_answer_and_first_block(ex, compat):
    task = build_task("deduction", ex, compat=compat)
    text = (
        "plan</think><answer>```python\ndef f(a):\n    return a + 1\n```\n```python\ndef f(a):\n"
        "    return a + 2\n```\n```input\n1\n```\n```input\n5\n```</answer>"
    )
    prob = task.parse_proposals([text], [None], ["t"])[0]
    assert prob.outputs == ["2"]
    no_tags = P.format_code_proposal("def f(a):\n    return a", "1")
    assert "parse" in task.parse_proposals([no_tags], [None], ["t"])[0].error


def test_abduction_answer_injection(ex):
    fixed_abd, released_abd = tasks(ex, "abduction")
    program = "def f(a, b):\n    return a + b"
    ours, theirs = propose(fixed_abd, program, "2, 3"), propose(released_abd, program, "2, 3")
    injection = "0, 0) or True or (0"  # closes the call and adds a true disjunct
    liar = "type('X', (), {'__eq__': lambda s, o: True, '__add__': lambda s, o: s})(), 0"
    assert solve(released_abd, theirs, "1, 4", injection, liar) == [True, True, True]
    assert solve(fixed_abd, ours, "1, 4", injection, liar) == [True, False, False]


# --- section 2: executor and validity pipeline ----------------------------------------------------------------


def test_input_substring_ban(ex):
    program = "def user_input(s):\n    return s.upper()"
    fixed_ded, released_ded = tasks(ex, "deduction")
    assert propose(fixed_ded, program, "'a'").outputs == ["'A'"]
    assert "input(" in propose(released_ded, program, "'a'").error
    assert "builtin input" in propose(fixed_ded, "def f(a):\n    return input()", "1").error
    # the release refuses it in solver checks too, e.g. an abduction answer mentioning it
    released_abd = build_task("abduction", ex, compat=RELEASED)
    prob = propose(released_abd, "def f(a):\n    return len(a)", "'ab'")
    assert solve(released_abd, prob, "'input(' ", "'xy'") == [False, True]


@pytest.mark.parametrize(
    "program",
    [
        "import os\n\ndef f(a):\n    return len(os.sep) + a",
        "import os.path\n\ndef f(a):\n    return os.path.join('x', a)",
        "def f(a):\n    return __import__('random').randint(a, a)",
    ],
)
def test_banned_list_only_checks_imports_in_release(ex, program):
    fixed_ded, released_ded = tasks(ex, "deduction")
    assert "banned" in propose(fixed_ded, program, "1").error
    assert "banned" not in (propose(released_ded, program, "1").error or "")


@pytest.mark.parametrize(
    "program,inp",
    [
        ("count = [0]\n\ndef f(a):\n    count[0] += 1\n    return a + count[0]", "1"),  # global counter
        ("def f(a):\n    raise Exception('boom')", "1"),  # bare Exception
        ("def f(a):\n    raise StopIteration", "1"),
        ("class Box:\n    pass\n\ndef f(a):\n    return Box()", "1"),  # no __eq__: a != a
    ],
)
def test_released_accepts_broken_programs_with_empty_output(ex, program, inp):
    fixed_ded, released_ded = tasks(ex, "deduction", one_def=False)
    theirs = propose(released_ded, program, inp)
    assert theirs.valid and theirs.outputs == [""]
    assert solve(released_ded, theirs, "1", "''") == [False, False]  # and no answer can solve them
    ours = propose(fixed_ded, program, inp)
    assert not ours.valid


def test_errors_with_error_in_the_message_are_invalid_in_both(ex):
    for task in tasks(ex, "deduction"):
        assert not propose(task, "def f(a):\n    return a[5]", "[1]").valid  # IndexError


def test_none_return_accepted_only_in_release(ex):
    fixed_ded, released_ded = tasks(ex, "deduction")
    program = "def f(a):\n    a.sort()"
    assert "None" in propose(fixed_ded, program, "[2, 1]").error
    assert propose(released_ded, program, "[2, 1]").outputs == ["None"]


def test_hash_order_dependence_only_caught_across_processes(ex):
    program = "def f(n):\n    return list({str(i) for i in range(n)})"
    fixed_ded, released_ded = tasks(ex, "deduction")
    assert "non-deterministic" in propose(fixed_ded, program, "40").error
    assert propose(released_ded, program, "40").valid  # one process: the order looks stable


def test_deduction_fast_path_accepts_expressions_in_release(ex):
    fixed_ded, released_ded = tasks(ex, "deduction")
    ours, theirs = (
        propose(fixed_ded, "def f(a):\n    return a * 2", "3"),
        propose(released_ded, "def f(a):\n    return a * 2", "3"),
    )
    assert solve(released_ded, theirs, "6", "3 + 3", "7") == [True, True, False]
    assert solve(fixed_ded, ours, "6", "3 + 3", "7") == [True, False, False]  # answers must be literals


@pytest.mark.parametrize("compat", [FIXED, RELEASED])
def test_solver_crash_is_wrong_not_format_failure(ex, compat):
    task = build_task("abduction", ex, compat=compat)
    prob = propose(task, "def f(a):\n    return 10 // a", "2")
    [grade] = task.grade(prob, [P.format_solver_answer("abduction", "0", think="s")])
    assert (grade.correct, grade.formatted, grade.reward) == (False, True, -0.5)


# --- section 3: rewards -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compat", [FIXED, RELEASED])
def test_learnability_reward_and_released_extremes(ex, compat):
    task = build_task("deduction", ex, compat=compat)
    prob = propose(task, "def f(a):\n    return -a", "4")
    assert [task.proposer_reward(prob, r) for r in (0.0, 0.5, 1.0, None)] == [-0.5, 0.5, -0.5, -1.0]
    paper = build_task("deduction", ex, compat=compat, unsolved_reward=0.0, solved_reward=0.0)  # paper Eq. 4
    assert paper.proposer_reward(prob, 0.0) == 0.0


def test_valid_program_with_bad_format_enters_the_buffer_but_scores_minus_one(ex):
    task = build_task("deduction", ex)
    text = P.format_code_proposal("def f(a):\n    return a - 1", "3")
    prob = task.parse_proposals(["plan <answer>" + text + "</answer>"], [None], ["t"])[0]
    assert prob.valid and not prob.metrics["formatted"]
    assert task.proposer_reward(prob, 0.5) == -1.0
    task.add_to_buffer([prob])
    assert task.buffer.items[-1].program == prob.program


def test_format_check_regex():
    assert P.check_format("a</think>\n<answer>b</answer> then more", "azr")
    assert not P.check_format("a</think> text <answer>b</answer>", "azr")


# --- sections 8-9: buffers and checklist -------------------------------------------------------------------------


def test_buffer_cap_keeps_first_in_release_newest_in_fixed(ex):
    new = [
        CodeProblem("abduction", f"def f(a):\n    return a + {k}", ["1"], [str(k + 1)], valid=True) for k in range(6)
    ]
    fixed_abd, released_abd = tasks(ex, "abduction", buffer_cap=3)
    fixed_abd.add_to_buffer(new)
    released_abd.add_to_buffer(new)
    assert [p.outputs[0] for p in fixed_abd.buffer.items] == ["'Hello world'", "5", "6"]
    assert [p.outputs[0] for p in released_abd.buffer.items] == ["'Hello world'", "1", "2"]


def test_banned_list_defaults():
    from populora_azr.checks import AZR_BANNED, EXTRA_BANNED

    assert len(AZR_BANNED) == 16 and "os.sys" in AZR_BANNED and "sys" not in AZR_BANNED
    assert {"os", "sys", "shutil"} <= set(EXTRA_BANNED)


def test_seeds_appear_once_per_code_buffer_in_the_induction_union(ex):
    ind = build_tasks(("deduction", "abduction", "induction"), ex)["induction"]
    pool = [p.program for p in ind.program_pool()]
    assert pool.count("def f(a):\n    return a") == 2 and len(pool) == 2
    assert ind.proposer_prompts(1, random.Random(0))[0][1]["program"] == "def f(a):\n    return a"
