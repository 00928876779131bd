"""AZR task components end to end against the executor: validation, grading, rewards, buffers, state."""

from __future__ import annotations

import builtins
import json
import random
import sys

import pytest
from populora_azr import prompts as P
from populora_azr.problems import CodeProblem

from populora_core.api import UserError
from populora_core.api.components import ExecJob, Task
from tests.azr_support import build_task, build_tasks, shared_executor


@pytest.fixture
def ex():
    return shared_executor()


def propose(task, program: str, inp: str, style: str = "azr") -> CodeProblem:
    text = P.format_code_proposal(program, inp, think="plan")
    return task.parse_proposals([text], [None], ["t0@v1"])[0]


def answer(task_type: str, body: str) -> str:
    return P.format_solver_answer(task_type, body, think="hmm")


# --- registry and params ---------------------------------------------------------------------------------


def test_registered_with_params_models(ex):
    from populora_core.plugin.manager import get_manager

    reg = get_manager().registry
    for name in ("deduction", "abduction", "induction"):
        comp = reg.get("task", name)
        task = comp.factory(comp.parse_params({}), executor=ex, rng=random.Random(0))
        assert isinstance(task, Task) and task.name == name
        assert comp.parse_params({}).compat == "fixed"
    assert reg.get("task", "induction").parse_params({}).n_inputs == 10
    assert reg.get("task", "deduction").parse_params({}).references == 6
    with pytest.raises(Exception, match="n_inputs"):
        reg.get("task", "deduction").parse_params({"n_inputs": 4})
    with pytest.raises(Exception, match="compat"):
        reg.get("task", "deduction").parse_params({"compat": "loose"})


# --- validation ---------------------------------------------------------------------------------------------


def test_valid_proposal_is_renamed_measured_and_has_output(ex):
    task = build_task("deduction", ex)
    prob = propose(task, "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)", "'education'")
    assert prob.valid, prob.error
    assert prob.program.startswith("def f(s)") and prob.outputs == ["5"] and prob.inputs == ["'education'"]
    assert prob.proposer == "t0@v1"
    assert {"ast_depth", "cyclomatic", "loc", "ast_nodes"} <= prob.metrics.keys() and len(prob.signature) == 16


@pytest.mark.parametrize(
    "program,inp,why",
    [
        ("def f(a):\n    return 1 / a", "0", "ZeroDivisionError"),
        ("def f(a):\n    raise Exception('boom')", "1", "boom"),
        ("def f(a):\n    while True:\n        a += 1", "1", "timeout"),
        ("from collections import deque\ndef f(a):\n    return deque(a)", "[1, 2]", "plain literal"),
        ("def f(a):\n    a.append(1)", "[]", "None"),
        ("def f(a):\n    return 'x' * a", "5000", "longer than"),
        ("def f(a):\n    return {str(i) for i in range(a)}", "30", "non-deterministic"),
        ("class P:\n    pass\n\ndef f(a):\n    return P()", "1", "non-deterministic"),  # repr has an address
        ("class P:\n    def __repr__(self):\n        return '1'\n\ndef f(a):\n    return P()", "1", "plain literal"),
        ("def f(a):\n    return a\n\ndef g(b):\n    return b", "1", "top-level functions"),
        ("import random\ndef f(a):\n    return random.random()", "1", "banned"),
        ("def f(a):\n    return a", "__import__('os').getpid()", "banned in input"),
        ("def f(a):\n    return a", "1) or (2", "one call of f"),
        ("def f(a):\n    return float(a)", "'nan'", "evaluate back"),
    ],
)
def test_invalid_proposals(ex, program, inp, why):
    task = build_task("deduction", ex, timeout_s=2.0)
    prob = propose(task, program, inp)
    assert not prob.valid and why in (prob.error or ""), prob.error
    assert task.proposer_reward(prob, 0.5) == -1.0


def test_global_state_mutation_is_caught_within_a_process(ex):
    task = build_task("deduction", ex)
    prob = propose(task, "seen = []\ndef f(a):\n    seen.append(a)\n    return len(seen)", "1")
    assert not prob.valid and "non-deterministic" in prob.error


def test_nested_defs_and_classes_are_allowed_by_default(ex):
    task = build_task("abduction", ex)
    program = (
        "class Acc:\n    def __init__(self):\n        self.t = 0\n    def add(self, x):\n"
        "        self.t += x\n        return self\n\n"
        "def f(a):\n    def sq(x):\n        return x * x\n    acc = Acc()\n    for x in a:\n"
        "        acc.add(sq(x))\n    return acc.t"
    )
    prob = propose(task, program, "[1, 2, 3]")
    assert prob.valid, prob.error
    assert prob.outputs == ["14"]
    strict = build_task("abduction", ex, compat="azr-released")
    assert "function definitions" in propose(strict, program, "[1, 2, 3]").error
    loose = build_task("abduction", ex, compat="azr-released", one_def=False)
    assert propose(loose, program, "[1, 2, 3]").valid is False  # AZR renames the first def: __init__ -> f
    llama = build_task("abduction", ex, compat="azr-released", one_def=False, f_replace_location="any_last")
    assert propose(llama, program, "[1, 2, 3]").outputs == ["14"]  # AZR's Llama / Qwen3-4B settings


def test_unformatted_but_valid_proposal_gets_invalid_reward(ex):
    task = build_task("deduction", ex)
    text = "<answer>" + P.format_code_proposal("def f(a):\n    return a * 2", "4") + "</answer>"  # no </think>
    prob = task.parse_proposals([text], [None], ["t"])[0]
    assert prob.valid and prob.metrics["formatted"] is False
    assert task.proposer_reward(prob, 0.5) == -1.0


# --- grading ------------------------------------------------------------------------------------------------


def test_deduction_grading(ex):
    task = build_task("deduction", ex)
    prob = propose(task, "def f(a):\n    return {'n': len(a), 'r': a[::-1]}", "'abc'")
    assert prob.valid, prob.error
    grades = task.grade(
        prob,
        [
            answer("deduction", "{'r': 'cba', 'n': 3}"),  # dict order does not matter (==)
            answer("deduction", "{'n': 3, 'r': 'abc'}"),  # wrong
            answer("deduction", "f('abc')"),  # calling f is not an output literal
            "```output\n{'n': 3, 'r': 'cba'}\n```",  # right value, no think/answer format
        ],
    )
    assert [(g.correct, g.formatted, g.reward) for g in grades] == [
        (True, True, 1.0),
        (False, True, -0.5),
        (False, True, -0.5),
        (False, False, -1.0),
    ]


def test_grade_many_checks_a_steps_answers_in_one_executor_batch_with_the_grades_of_one_at_a_time(ex):
    """The loop grades a step's answers per task in one ``grade_many`` call: one executor batch, each problem's
    grades those of ``grade`` alone (an answer refused before running, ``f('abc')``, keeps the others aligned)."""
    task = build_task("abduction", ex)
    first = propose(task, "def f(a):\n    return {'n': len(a), 'r': a[::-1]}", "'abc'")
    second = propose(task, "def f(a):\n    return a * 3", "2")
    assert first.valid and second.valid
    items = [
        (first, [answer("abduction", "import os"), answer("abduction", "'abc'"), "no format"]),
        (second, [answer("abduction", "2"), answer("abduction", "7"), answer("abduction", "2")]),
        (first, [answer("abduction", "'cba'")]),
    ]
    alone = [task.grade(problem, answers) for problem, answers in items]
    batches = []
    run_batch = ex.run_batch

    def counted(jobs):
        batches.append(len(jobs))
        return run_batch(jobs)

    task.executor = type("Counted", (), {"run_batch": staticmethod(counted)})()
    assert task.grade_many(items) == alone
    assert len(batches) == 1
    assert [[g.correct for g in grades] for grades in alone] == [[False, True, False], [True, False, True], [False]]


DEDUCTION_CASES = [  # (gold output repr, answer): literal data of every kind, and what is not literal data
    ("{'n': 3, 'r': 'cba'}", "{'r': 'cba', 'n': 3}"),
    ("[1, 1.0, {1, 2}]", "[1.0, True, {2, 1}]"),
    ("[1, 1.0, {1, 2}]", "[1, 1, {1}]"),
    ("(1,)", "[1]"),
    ("b'ab'", "b'ab'"),
    ("b'ab'", "'ab'"),
    ("None", "None"),
    ("0.5", "float('nan')"),
    ("1e+300", "1e300"),
    ("inf", "1e999"),  # not a gold a validated problem can have: the sandbox's literal_eval of it raises
    ("-0.0", "0"),
    ("(1+2j)", "1+2j"),
    ("frozenset({1})", "{1}"),
    ("set()", "set()"),
    ("12", "1" * 5000),  # past the int string limit: literal_eval raises in both
    ("'x'", "f('abc')"),
    ("'x'", "__import__('os').getcwd()"),
    ("'x'", "[1, 2"),
    ("[[[[1]]]]", "[[[[1]]]]"),
    ("[]", "[" * 60 + "]" * 60),  # deep: left to the sandbox
    ("1", "1 if True else 2"),
]


def test_deduction_checks_literal_answers_without_the_sandbox_and_as_the_sandbox_does(ex):
    """A deduction answer is literal data: parsing and comparing it runs no program, so the task decides it in
    process (a fork saved per distinct answer). Each verdict equals the sandbox job's on the same pair; a literal
    nested past LITERAL_DEPTH still goes to the sandbox."""
    from populora_azr.sandbox_code import FIXED_HELPERS, literal_verdict

    jobs = []
    for gold, text in DEDUCTION_CASES:
        expr = f"_populora_eq({gold!r}, _populora_ast.literal_eval({text!r}))"
        jobs.append(ExecJob(code=FIXED_HELPERS, expr=expr, timeout_s=10, memory_mb=1024))
    sandboxed = [r.status == "ok" and r.value == "True" for r in ex.run_batch(jobs)]
    here = [literal_verdict(gold, text) for gold, text in DEDUCTION_CASES]
    assert [h for h, (_, text) in zip(here, DEDUCTION_CASES) if h is None] == [None]  # the deep one only
    assert [h if h is not None else s for h, s in zip(here, sandboxed)] == sandboxed
    assert sum(sandboxed) >= 8  # both outcomes are covered

    task = build_task("deduction", ex)
    prob = propose(task, "def f(a):\n    return {'n': len(a), 'r': a[::-1]}", "'abc'")
    batches = []
    task.executor = type("Counted", (), {"run_batch": staticmethod(lambda jobs: batches.append(jobs) or [])})()
    got = task.grade(prob, [answer("deduction", "{'r': 'cba', 'n': 3}"), answer("deduction", "f('abc')")])
    assert [g.correct for g in got] == [True, False] and batches == []


def test_deduction_equality_is_plain_python_eq(ex):
    task = build_task("deduction", ex)
    prob = propose(task, "def f(a):\n    return [a, a * 1.0, {a, a + 1}]", "1")
    assert prob.valid, prob.error
    got = task.grade(prob, [answer("deduction", "[1.0, True, {2, 1}]"), answer("deduction", "[1, 1, {1}]")])
    assert [g.correct for g in got] == [True, False]


def test_abduction_accepts_any_input_with_the_gold_output_and_refuses_tricks(ex):
    task = build_task("abduction", ex)
    prob = propose(task, "def f(a, b):\n    return a + b", "2, 3")
    assert prob.valid and prob.outputs == ["5"]
    # an object that adds to itself and equals everything: AZR's plain == would accept it
    cheat = "type('X', (), {'__eq__': lambda s, o: True, '__add__': lambda s, o: s})(), 0"
    got = task.grade(
        prob,
        [
            answer("abduction", "1, 4"),
            answer("abduction", "2, 2"),
            answer("abduction", "1, 4) or (1"),
            answer("abduction", cheat),
        ],
    )
    assert [g.correct for g in got] == [True, False, False, False]


def test_induction_end_to_end(ex):
    task = build_task("induction", ex)
    program = "import math\n\ndef f(a):\n    return math.isqrt(a) * 2"
    completion = P.format_induction_proposal([str(i * i + 1) for i in range(12)], "twice a root", think="x")
    prob = task.parse_proposals([completion], [{"program": program}], ["t"])[0]
    assert prob.valid, prob.error
    assert len(prob.inputs) == 10 and prob.inputs[0] == "5" and prob.outputs[0] == "4"
    shown, hidden = task.split(prob)
    assert len(shown) == len(hidden) == 5
    prompt = task.solver_prompt(prob)
    assert shown[0][1] in prompt and hidden[0][0] not in prompt and "twice a root" in prompt
    good = "def f(a):\n    return math.isqrt(a) * 2"  # uses the gold program's import
    overfit = "def f(a):\n    return {5: 4, 10: 6, 17: 8, 26: 10, 37: 12}[a]"
    got = task.grade(
        prob,
        [
            answer("induction", good),
            answer("induction", overfit),
            answer("induction", "import os\ndef f(a):\n    return os.getpid()"),
        ],
    )
    assert [g.correct for g in got] == [True, False, False]


def test_induction_needs_every_input_valid(ex):
    task = build_task("induction", ex)
    inputs = [str(i) for i in range(9)] + ["0"]
    completion = P.format_induction_proposal(inputs, "inverse", think="x")
    prob = task.parse_proposals([completion], [{"program": "def f(a):\n    return 1 / (a - 3)"}], ["t"])[0]
    assert not prob.valid and "input 4" in prob.error


def test_grading_never_evaluates_model_text_in_this_process(ex, monkeypatch):
    task = build_task("deduction", ex, compat="azr-released")
    prob = propose(task, "def f(a):\n    return a + 1", "1")
    calls = []
    real_eval, real_exec = builtins.eval, builtins.exec

    def spy(real):
        def inner(*args, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("populora_azr"):
                calls.append((caller, args[0]))
            return real(*args, **kwargs)

        return inner

    monkeypatch.setattr(builtins, "eval", spy(real_eval))
    monkeypatch.setattr(builtins, "exec", spy(real_exec))
    got = task.grade(prob, [answer("deduction", "2"), answer("deduction", "__import__('os').getcwd()")])
    assert [g.correct for g in got] == [True, False] and calls == []


# --- rewards ------------------------------------------------------------------------------------------------


def test_proposer_reward_table(ex):
    task = build_task("deduction", ex)
    prob = propose(task, "def f(a):\n    return a * 3", "2")
    assert task.proposer_reward(prob, 0.25) == pytest.approx(0.75)
    assert task.proposer_reward(prob, 1 / 8) == pytest.approx(0.875)
    assert task.proposer_reward(prob, 0.0) == -0.5 and task.proposer_reward(prob, 1.0) == -0.5
    assert task.proposer_reward(prob, None) == -1.0
    paper = build_task("deduction", ex, unsolved_reward=0.0, solved_reward=0.0, invalid_reward=-2.0)
    assert paper.proposer_reward(prob, 1.0) == 0.0 and paper.proposer_reward(prob, None) == -2.0
    split = build_task("deduction", ex, unsolved_reward=0.0, solved_reward=-0.5)
    assert split.proposer_reward(prob, 0.0) == 0.0 and split.proposer_reward(prob, 1.0) == -0.5
    with pytest.raises(UserError, match="extreme_reward: unknown key"):  # the alias of both, gone in 0.x (CHANGELOG)
        build_task("deduction", ex, extreme_reward=0.25)
    with pytest.raises(ValueError):
        task.proposer_reward(prob, 1.5)


def test_solver_reward_settings(ex):
    task = build_task("deduction", ex, solver_correct=2.0, solver_wrong=0.0, solver_format=-3.0)
    prob = propose(task, "def f(a):\n    return a * 3", "2")
    got = task.grade(prob, [answer("deduction", "6"), answer("deduction", "7"), "6"])
    assert [g.reward for g in got] == [2.0, 0.0, -3.0]


# --- buffers ------------------------------------------------------------------------------------------------


def _valid(task_type: str, k: int) -> CodeProblem:
    return CodeProblem(task_type, f"def f(a):\n    return a + {k}", ["1"], [str(k + 1)], valid=True, proposer="t")


def test_zero_triplet_seed_and_references_without_replacement(ex):
    task = build_task("deduction", ex)
    [(prompt, ctx)] = task.proposer_prompts(1, random.Random(0))
    assert ctx["references"] == [["def f(a):\n    return a", "'Hello world'", "'Hello world'"]]
    task.add_to_buffer([_valid("deduction", k) for k in range(20)])
    for prompt, ctx in task.proposer_prompts(5, random.Random(1)):
        refs = [tuple(r) for r in ctx["references"]]
        assert len(refs) == 6 and len(set(refs)) == 6
        assert all(r[0] in prompt for r in refs)


def _long(task_type: str, k: int) -> CodeProblem:
    body = "".join(f"    a = a + {k + i}\n" for i in range(12))
    return CodeProblem(task_type, f"def f(a):\n{body}    return a", ["1"], ["2"], valid=True, proposer="t")


def test_compact_references_are_shown_as_drawn_and_overflow_is_counted(ex):
    """AZR: the K drawn references are all shown, long ones too; a prompt over the budget is counted."""
    task = build_task("abduction", ex, style="compact")
    task.add_to_buffer([_long("abduction", 100 * k) for k in range(12)] + [_valid("abduction", k) for k in range(12)])
    got = task.proposer_prompts(40, random.Random(3))
    for prompt, ctx in got:
        assert ctx["drawn"] == 6 and len(ctx["references"]) == 6
        assert all(program in prompt for program, _, _ in ctx["references"])
        assert ctx["over_budget"] == (len(prompt) > 900)
    metrics = task.proposer_metrics([ctx for _, ctx in got])
    assert metrics["references/drawn"] == metrics["references/shown"] == 6
    over = sum(len(prompt) > 900 for prompt, _ in got)
    assert 0 < over < len(got) and metrics["references/over_budget"] == over
    buffer_chars = sum(len(p.program) for p in task.buffer.items) / len(task.buffer.items)
    assert metrics["buffer/program_chars"] == pytest.approx(buffer_chars)
    shown = [len(program) for _, ctx in got for program, _, _ in ctx["references"]]
    assert metrics["references/program_chars"] == pytest.approx(sum(shown) / len(shown))


def test_skip_long_references_favour_short_programs_and_are_counted(ex):
    """The pre-issue-32 rule, kept for ablations: references that do not fit are skipped, and counted."""
    drawn_by = {}
    for fit in ("all", "skip_long"):
        task = build_task("deduction", ex, style="compact", references_fit=fit, proposer_max_chars=800)
        task.add_to_buffer(
            [_long("deduction", 100 * k) for k in range(12)] + [_valid("deduction", k) for k in range(12)]
        )
        got = task.proposer_prompts(60, random.Random(5))
        drawn_by[fit] = (task.proposer_metrics([ctx for _, ctx in got]), got)
    kept, got = drawn_by["skip_long"]
    assert all(len(prompt) <= 800 for prompt, _ in got)
    assert kept["references/shown"] < kept["references/drawn"] == 6
    assert kept["references/over_budget"] == sum(len(ctx["references"]) < 6 for _, ctx in got) > 0
    shown_all = drawn_by["all"][0]
    # the same draws: skipping favours the short programs, showing all keeps the buffer's mean length
    assert kept["references/program_chars"] < shown_all["references/program_chars"]
    assert shown_all["references/program_chars"] == pytest.approx(shown_all["buffer/program_chars"], rel=0.15)


def test_a_budget_that_cannot_hold_k_references_is_a_recipe_error_naming_the_key(tmp_path):
    from tests.cli_helpers import REPO, invoke_cli

    recipe = str(REPO / "recipes" / "nano.yaml")
    six = ["tasks.0.params.references=6", "tasks.1.params.references=6"]
    bad = invoke_cli("validate", recipe, *six, "tasks.1.params.proposer_max_chars=600")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "tasks.1.params.proposer_max_chars" in bad.stderr and "references: 6" in bad.stderr
    assert "at least 776" in bad.stderr and "lower references to 4" in bad.stderr
    fewer = invoke_cli("validate", recipe, *six, "tasks.1.params.proposer_max_chars=600", "tasks.1.params.references=4")
    assert fewer.returncode == 0, fewer.stderr
    skip = ["tasks.0.params.proposer_max_chars=600", "tasks.0.params.references_fit=skip_long"]
    warned = invoke_cli("validate", recipe, *six, *skip, "tasks.1.params.references=2")
    assert warned.returncode == 0 and warned.stderr.count("Warning") == 1
    assert "proposer_max_chars 600 holds about 2 of references: 6" in warned.stderr
    assert "skip_long leaves the others out" in warned.stderr


def test_a_budget_that_holds_k_references_only_while_they_are_short_is_a_warning():
    """900 characters hold about 4 typical compact references: K = 6 warns, K = 4 and nano's K = 3 do not."""
    from tests.cli_helpers import REPO, invoke_cli

    recipe = str(REPO / "recipes" / "nano.yaml")
    shipped = invoke_cli("validate", recipe)
    assert shipped.returncode == 0 and "Warning" not in shipped.stderr
    six = invoke_cli("validate", recipe, "tasks.0.params.references=6", "tasks.1.params.references=6")
    assert six.returncode == 0 and "Warning: proposer_max_chars 900 holds about 4 of references: 6" in six.stderr
    assert "counted in task/<name>/references/over_budget" in six.stderr
    four = invoke_cli("validate", recipe, "tasks.0.params.references=4", "tasks.1.params.references=4")
    assert four.returncode == 0 and "Warning" not in four.stderr


def test_buffer_dedup_cap_and_eviction(ex):
    newest = build_task("deduction", ex, buffer_cap=5)
    newest.add_to_buffer([_valid("deduction", k) for k in range(8)] + [_valid("deduction", 7)])
    kept = [p.program for p in newest.buffer.items]
    assert len(kept) == 5 and kept[0].endswith("return a")  # the seed stays
    assert [k[-1] for k in kept[1:]] == ["4", "5", "6", "7"]
    oldest = build_task("deduction", ex, buffer_cap=5, compat="azr-released")
    oldest.add_to_buffer([_valid("deduction", k) for k in range(8)])
    assert [p.program[-1] for p in oldest.buffer.items[1:]] == ["0", "1", "2", "3"]
    invalid = _valid("deduction", 99)
    invalid.valid = False
    newest.add_to_buffer([invalid, _valid("abduction", 50)])  # invalid and other-task problems are ignored
    assert len(newest.buffer) == 5 and all(not p.program.endswith("99") for p in newest.buffer.items)


def test_sample_problems_recent_first(ex):
    task = build_task("abduction", ex)
    task.add_to_buffer([_valid("abduction", k) for k in range(10)])
    task.add_to_buffer([_valid("abduction", k) for k in range(10, 13)])
    got = task.sample_problems(8, random.Random(0))
    assert len(got) == 8
    assert {p.program for p in got[:3]} == {_valid("abduction", k).program for k in (10, 11, 12)}


def test_state_dict_round_trip_is_json(ex):
    task = build_task("induction", ex)
    prob = task.parse_proposals(
        [P.format_induction_proposal([str(i) for i in range(10)], "neg", think="x")],
        [{"program": "def f(a):\n    return -a"}],
        ["t"],
    )[0]
    task.add_to_buffer([prob])
    state = json.loads(json.dumps(task.state_dict()))
    fresh = build_task("induction", ex)
    fresh.load_state_dict(state)
    assert [p.program for p in fresh.buffer.items] == [p.program for p in task.buffer.items]
    assert fresh.buffer.items[-1].outputs == prob.outputs and fresh.buffer.items[-1].metrics == prob.metrics
    assert fresh.sample_problems(1, random.Random(0))[0].program == prob.program
    with pytest.raises(ValueError, match="induction"):
        build_task("deduction", ex).load_state_dict(state)


def test_induction_samples_programs_from_the_union_of_code_buffers(ex):
    run = build_tasks(("deduction", "abduction", "induction"), ex)
    run["deduction"].add_to_buffer([_valid("deduction", 1)])
    run["abduction"].add_to_buffer([_valid("abduction", 2)])
    pool = {p.program for p in run["induction"].program_pool()}
    assert {_valid("deduction", 1).program, _valid("abduction", 2).program} <= pool
    drawn = {ctx["program"] for _, ctx in run["induction"].proposer_prompts(200, random.Random(0))}
    assert _valid("deduction", 1).program in drawn and _valid("abduction", 2).program in drawn


def test_induction_pool_follows_the_order_of_the_tasks_mapping(ex):
    """The pool's order picks the programs a seeded rng draws: it follows the run's mapping (recipe
    order), the same for every process, wherever induction stands in it."""
    for kinds in [("deduction", "abduction", "induction"), ("induction", "abduction", "deduction")]:
        run = build_tasks(kinds, ex)
        code = [t for t in run.values() if t.name != "induction"]
        for i, task in enumerate(code):
            task.add_to_buffer([_valid(task.name, 10 + i)])
        pool = [p.program for p in run["induction"].program_pool()]
        seed = "def f(a):\n    return a"
        assert pool == [x for i, t in enumerate(code) for x in (seed, _valid(t.name, 10 + i).program)], kinds


def test_induction_draws_only_from_its_own_runs_tasks_with_a_shared_executor(ex):
    """Two runs built with one executor object: each induction task sees its own run's buffers only
    (the old module-global registry keyed on the executor mixed them), and nothing stays in the module."""
    import itertools
    import weakref

    from populora_azr import code_io, code_task, induction, sandbox_code

    first = build_tasks(("deduction", "abduction", "induction"), ex)
    second = build_tasks(("deduction", "abduction", "induction"), ex)
    alone = build_task("induction", ex)
    first["deduction"].add_to_buffer([_valid("deduction", 1)])
    first["abduction"].add_to_buffer([_valid("abduction", 2)])
    second["deduction"].add_to_buffer([_valid("deduction", 3)])
    ours = {_valid("deduction", 1).program, _valid("abduction", 2).program}
    drawn = {ctx["program"] for _, ctx in first["induction"].proposer_prompts(300, random.Random(0))}
    assert drawn == ours | {"def f(a):\n    return a"}
    assert _valid("deduction", 3).program in {p.program for p in second["induction"].program_pool()}
    assert not ours & {p.program for p in second["induction"].program_pool()}
    assert [p.program for p in alone.program_pool()] == ["def f(a):\n    return a"]
    stateful = (dict, set, weakref.WeakKeyDictionary, weakref.WeakValueDictionary, weakref.WeakSet, itertools.count)
    for module in (code_io, code_task, induction, sandbox_code):  # every module of the three tasks
        assert not [n for n, v in vars(module).items() if not n.startswith("__") and isinstance(v, stateful)]
        assert not [n for n in vars(module) if "PEER" in n.upper()]


def test_induction_alone_uses_problems_handed_to_it(ex):
    ind = build_task("induction", ex)  # no tasks mapping: its own program list only
    assert [p.program for p in ind.program_pool()] == ["def f(a):\n    return a"]
    ind.add_to_buffer([_valid("deduction", 3)])
    assert _valid("deduction", 3).program in {p.program for p in ind.program_pool()}


# --- compact style ---------------------------------------------------------------------------------------------------


def test_compact_style_end_to_end(ex):
    task = build_task("deduction", ex, style="compact")
    [(prompt, _)] = task.proposer_prompts(1, random.Random(0))
    assert prompt.startswith("[deduction:propose]") and prompt.endswith("Answer:\n")
    completion = P.format_code_proposal("def f(a):\n    return a[::-1]", "[1, 2]")
    prob = task.parse_proposals([completion], [None], ["t"])[0]
    assert prob.valid and prob.outputs == ["[2, 1]"]
    assert task.solver_prompt(prob).startswith("[deduction:solve]")
    got = task.grade(prob, ["```output\n[2, 1]\n```", "```output\n[1, 2]\n```", "[2, 1]"])
    assert [(g.correct, g.formatted) for g in got] == [(True, True), (False, True), (False, False)]


def test_released_fast_path_runs_model_text_in_the_sandbox_not_here(ex, tmp_path):
    if type(ex).__name__ == "SubprocessTestExecutor":
        pytest.skip("needs the sandbox executor (the test-only fallback isolates nothing)")
    task = build_task("deduction", ex, compat="azr-released")
    prob = propose(task, "def f(a):\n    return a + 1", "1")
    target = tmp_path / "written_by_model"
    hostile = f"open({str(target)!r}, 'w').write('x')"  # AZR would run this in its trainer process
    [grade] = task.grade(prob, [answer("deduction", hostile)])
    assert not grade.correct and not target.exists()


@pytest.mark.parametrize(
    "program,inp",
    [
        ("def g(a):\n    return a", "[" * 400 + "]" * 400),  # parser nesting limit
        ("def g(a):\n    return a", "[" * 5000 + "]" * 5000),  # over the size cap
        ("def g(a):\n    return " + "-" * 3000 + "a", "1"),  # deep unary chain
        ("def g(a):\n    return a\x00", "1"),  # null byte
        ("def g(a):\n    return '''unterminated", "1"),
        ("def g(a):\nreturn a", "1"),  # bad indentation
        ("", "1"),
    ],
)
def test_pathological_proposals_are_invalid_not_crashes(ex, program, inp):
    task = build_task("deduction", ex, timeout_s=2.0)
    prob = propose(task, program, inp)
    assert not prob.valid and prob.error
    assert task.proposer_reward(prob, 0.5) == -1.0


def test_pathological_answers_are_wrong_not_crashes(ex):
    for name in ("deduction", "abduction", "induction"):
        task = build_task(name, ex, timeout_s=2.0)
        [seed] = task.buffer.items[:1]
        answers = ["[" * 400 + "]" * 400, "(" * 5000, "\x00", "'''", "def f(a:\n", "x" * 20000]
        grades = task.grade(seed, [answer(name, a) for a in answers])
        assert not any(g.correct for g in grades), name


class RecordingExecutor:
    """Passes jobs on to the real executor and keeps them, to check what the task asks it to run."""

    def __init__(self, inner):
        self.inner, self.jobs = inner, []

    def run_batch(self, jobs):
        self.jobs.extend(jobs)
        return self.inner.run_batch(jobs)

    def close(self):
        pass


@pytest.mark.parametrize("compat,variants", [("fixed", [0, 1]), ("azr-released", [0])])
def test_determinism_runs_use_distinct_hash_variants(ex, compat, variants):
    rec = RecordingExecutor(ex)
    task = build_task("deduction", rec, compat=compat, timeout_s=3.0, memory_mb=256)
    assert propose(task, "def f(a):\n    return a * 2", "21").valid
    assert [j.hash_variant for j in rec.jobs] == variants
    assert len({(j.code, j.expr) for j in rec.jobs}) == 1
    assert all(j.timeout_s == 3.0 and j.memory_mb == 256 for j in rec.jobs)


def test_identical_answers_are_checked_once_in_one_batch(ex):
    rec = RecordingExecutor(ex)
    task = build_task("abduction", rec)
    prob = propose(task, "def f(a):\n    return a * 2", "21")
    rec.jobs.clear()
    grades = task.grade(prob, [answer("abduction", "21")] * 5 + [answer("abduction", "20")] * 3)
    assert [g.correct for g in grades] == [True] * 5 + [False] * 3
    assert len(rec.jobs) == 2
