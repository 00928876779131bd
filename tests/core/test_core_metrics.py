"""The per-step proposal metrics (populora_core/run/metrics.py) on hand-built proposals: each number checked.

The tasks here are AZR-shaped (:class:`CodeProblem` payloads, AZR's ``problem_metrics`` and ``teacher_metrics``):
the core logs what the task reports, and the numbers are those of AZR's implementation."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pytest
from populora_azr.code_io import CodeIOTask
from populora_azr.problems import CodeProblem

from populora_core.api.components import Completion, Match, Problem, ProposerCapabilities, Task
from populora_core.api.errors import PluginError
from populora_core.api.population import Population
from populora_core.run.metrics import problem_records, step_metrics
from populora_core.run.proposals import Proposal


class _CodeTask(Task[CodeProblem]):
    """A task whose teachers write the program, reporting about its prompts."""

    problem_type = CodeProblem
    teacher_metrics = CodeIOTask.teacher_metrics
    problem_metrics = CodeIOTask.problem_metrics

    def proposer_metrics(self, contexts: list[Any]) -> dict[str, Any]:
        return {"references/shown": sum(c["shown"] for c in contexts) / len(contexts)}

    def record_fields(self, problem: CodeProblem) -> dict[str, Any]:
        return {"own_program": self.proposer.authors_problem}


class _PoolTask(_CodeTask):
    """A task whose programs come from a pool (as AZR's induction)."""

    proposer = ProposerCapabilities(authors_problem=False)

    def proposer_metrics(self, contexts: list[Any]) -> dict[str, Any]:
        return {}


def _proposal(
    task: str,
    teacher: Any,
    program: str,
    inputs: list[str],
    *,
    valid: bool = True,
    reason: str = "stop",
    logprobs: tuple[float, ...] = (-1.0, -1.0),
    prompt_len: int = 10,
    depth: int = 3,
    ctx: Any = None,
) -> Proposal:
    tokens = [] if reason == "prompt_too_long" else list(range(len(logprobs)))
    completion = Completion("text", tokens, list(logprobs) if tokens else [], [0] * prompt_len, reason)
    problem = CodeProblem(
        task, program, inputs, ["0"] * len(inputs), valid=valid, metrics={"ast_depth": depth}, signature=program[:5]
    )
    return Proposal(task, teacher, ctx, completion=completion, problem=problem)


@pytest.fixture
def step():
    pop = Population.create(2, 1)
    t0, t1 = pop.teachers
    tasks = {"deduction": _CodeTask(), "induction": _PoolTask()}
    proposals = [
        _proposal("deduction", t0, "def f(a): return a", ["12"], logprobs=(-2.0, -1.0, -0.0), ctx={"shown": 6}),
        _proposal("deduction", t0, "def f(a): return a", ["1234"], reason="length", logprobs=(-1.0,), ctx={"shown": 4}),
        _proposal("deduction", t1, "def g(b): return b", ["'abcdef'"], depth=5, ctx={"shown": 5}),
        _proposal("deduction", t1, "broken", [], valid=False, reason="length", ctx={"shown": 6}),
        _proposal("deduction", t1, "", [], valid=False, reason="prompt_too_long", prompt_len=99, ctx={"shown": 6}),
        _proposal("induction", t0, "def f(a): return a", ["1", "123"], depth=40, logprobs=(-3.0, -3.0)),
        _proposal("induction", t1, "def h(c): return c", ["12", "1234"], valid=False, reason="length"),
    ]
    matches = [Match(t0.id, "s0"), Match(t1.id, "s0")]
    metrics = step_metrics(1, pop, defaultdict(set), tasks, matches, [], proposals, [], {})
    return metrics, proposals, tasks, matches


def test_cut_off_proposals_are_counted_per_task_type(step):
    m, *_ = step
    assert m["task/deduction/cut_off"] == 2 and m["task/induction/cut_off"] == 1 and m["teacher/cut_off"] == 3
    assert m["task/deduction/cut_off_rate"] == pytest.approx(2 / 4)  # of the 4 generated (one never was)
    assert m["task/deduction/not_generated"] == 1 and m["task/deduction/proposals"] == 5


def test_mean_input_length_of_valid_proposals(step):
    m, *_ = step
    assert m["task/deduction/input_chars"] == pytest.approx((2 + 4 + 8) / 3)
    assert m["task/induction/input_chars"] == pytest.approx((1 + 3) / 2)  # the mean of one proposal's inputs


def test_token_nll_is_the_token_weighted_mean_of_the_sampled_tokens_negative_log_probs(step):
    m, *_ = step
    assert m["task/deduction/token_nll"] == pytest.approx((3 + 1 + 2 + 2) / (3 + 1 + 2 + 2))
    assert m["task/induction/token_nll"] == pytest.approx((6 + 2) / 4)
    assert m["teacher/token_nll"] == pytest.approx((3 + 1 + 2 + 2 + 6 + 2) / 12)
    assert m["member/t0/token_nll"] == pytest.approx((3 + 1 + 6) / 6)


def test_token_nll_is_none_when_the_engine_gave_no_log_probs():
    pop = Population.create(1, 1)
    (t0,) = pop.teachers
    proposals = [_proposal("deduction", t0, "def f(a): return a", ["1"], logprobs=(), ctx={"shown": 6})]
    m = step_metrics(1, pop, defaultdict(set), {"deduction": _CodeTask()}, [], [], proposals, [], {})
    assert m["task/deduction/token_nll"] is None and m["teacher/token_nll"] is None
    assert not any(isinstance(v, float) and math.isnan(v) for v in m.values())


def test_distinct_valid_programs(step):
    m, *_ = step
    assert m["task/deduction/distinct_programs"] == 2  # two teachers wrote the same program once
    assert m["task/deduction/valid_proposals"] == 3 and m["task/induction/valid_proposals"] == 1
    assert m["task/induction/distinct_programs"] == 1
    # distinct problems (by the task's problem_key: AZR's whole payload) the teachers wrote: t0's two share a
    # program but not an input; induction's pool programs are not the teachers'
    assert m["teacher/distinct_problems"] == 3


def test_teacher_program_metrics_leave_out_pool_programs_and_records_carry_the_tasks_own_fields(step):
    m, proposals, tasks, matches = step
    assert m["member/t0/ast_depth"] == 3  # not (3 + 3 + 40) / 3: the induction program is the pool's
    records = problem_records(1, proposals, {t: m for t, m in zip(("t0", "t1"), matches)}, tasks)
    assert [r["own_program"] for r in records] == [True] * 5 + [False] * 2  # what each task wrote
    keys = list(records[0])  # the task's fields after the loop's keys, before metric_*
    assert keys[keys.index("completion_tokens") :] == ["completion_tokens", "own_program", "metric_ast_depth"]
    assert [r["finish_reason"] for r in records][:5] == ["stop", "length", "stop", "length", "prompt_too_long"]
    assert records[0]["completion_tokens"] == 3


def test_prompt_lengths_and_the_tasks_own_prompt_metrics(step):
    m, *_ = step
    assert m["task/deduction/prompt_tokens"] == pytest.approx((4 * 10 + 99) / 5)
    assert m["task/deduction/prompt_tokens_max"] == 99
    assert m["task/deduction/references/shown"] == pytest.approx((6 + 4 + 5 + 6 + 6) / 5)
    assert "task/induction/references/shown" not in m


@dataclass
class _WordProblem(Problem):
    text: str


class _LevelledTask(Task[_WordProblem]):
    """A task whose difficulty is its word's length (1-3): known only to the task, never in ``Problem.metrics``."""

    problem_type = _WordProblem
    difficulty_levels = (1, 2, 3)

    def difficulty(self, problem: _WordProblem) -> int:
        return len(problem.text)


class _LevellessTask(_CodeTask):
    def difficulty(self, problem: Any) -> int:
        raise AssertionError("the loop asked a task without levels for a difficulty")


def _word(task: str, teacher: Any, text: str, solve_rate: float | None, *, valid: bool = True) -> Proposal:
    problem = _WordProblem(task, text, valid=valid)
    return Proposal(task, teacher, None, problem=problem, solve_rate=solve_rate)


def _levelled_step(tasks: dict[str, Task]) -> dict[str, Any]:
    """Three teachers, two students (t0 and t2 matched with s0, t1 with s1), the same words for every task in
    ``tasks`` that declares levels (an invalid one of length 9, outside the levels, and a proposal never parsed
    besides), one valid program for each task without."""
    pop = Population.create(3, 2)
    t0, t1, t2 = pop.teachers
    matches = [Match(t0.id, "s0"), Match(t1.id, "s1"), Match(t2.id, "s0")]
    proposals = []
    for name, task in tasks.items():
        if not task.difficulty_levels:
            proposals.append(_proposal(name, t0, "def f(a): return a", ["1"], ctx={"shown": 1}))
            continue
        proposals += [
            _word(name, t0, "a", 1.0),
            _word(name, t0, "abc", 0.25),
            _word(name, t0, "abcdefghi", None, valid=False),
            _word(name, t1, "ab", 0.5),
            _word(name, t1, "ab", 0.0),
            _word(name, t1, "abc", None),  # every answer dropped: a level, but no solve rate
            _word(name, t2, "a", 0.5),
            _word(name, t2, "abc", 0.75),
            Proposal(name, t2, None),  # never parsed
        ]
    return step_metrics(1, pop, defaultdict(set), tasks, matches, [], proposals, [], {})


def _assert_levelled(m: dict[str, Any], scope: str) -> None:
    assert m[f"member/t0/{scope}difficulty"] == pytest.approx((1 + 3) / 2)
    assert m[f"member/t1/{scope}difficulty"] == pytest.approx((2 + 2 + 3) / 3)
    assert m[f"member/t2/{scope}difficulty"] == pytest.approx((1 + 3) / 2)
    assert m[f"teacher/{scope}difficulty"] == pytest.approx((1 + 3 + 2 + 2 + 3 + 1 + 3) / 7)
    s0 = [m[f"member/s0/{scope}solve_rate_at_level/{level}"] for level in (1, 2, 3)]
    s1 = [m[f"member/s1/{scope}solve_rate_at_level/{level}"] for level in (1, 2, 3)]
    assert s0 == [pytest.approx((1.0 + 0.5) / 2), None, pytest.approx((0.25 + 0.75) / 2)]
    assert s1 == [None, pytest.approx((0.5 + 0.0) / 2), None]


def test_a_task_with_levels_logs_teacher_difficulty_and_solve_rate_per_level():
    m = _levelled_step({"words": _LevelledTask(), "deduction": _LevellessTask()})
    _assert_levelled(m, "")
    assert not any("/words/" in key and ("difficulty" in key or "at_level" in key) for key in m)


def test_a_task_without_levels_logs_no_difficulty():
    m = _levelled_step({"deduction": _LevellessTask()})
    assert [key for key in m if "difficulty" in key or "solve_rate_at_level" in key] == []


def test_two_tasks_with_levels_name_the_task_in_each_key():
    m = _levelled_step({"words": _LevelledTask(), "letters": _LevelledTask()})
    _assert_levelled(m, "words/")
    _assert_levelled(m, "letters/")
    assert "teacher/difficulty" not in m and "member/t0/difficulty" not in m


def test_a_difficulty_outside_the_declared_levels_is_a_plugin_error():
    class Narrow(_LevelledTask):
        difficulty_levels = (1, 2)

    with pytest.raises(PluginError, match=r"task 'words': difficulty 3 is not one of its levels \(1, 2\)"):
        _levelled_step({"words": Narrow()})


@pytest.mark.parametrize(
    ("own", "clash"), [({"valid": 1}, "valid"), ({"program": "x"}, "program"), ({"note": "ok"}, None)]
)
def test_a_tasks_record_fields_may_not_take_a_record_keys_or_payload_fields_name(own, clash):
    class _Writes(_CodeTask):
        def record_fields(self, problem: CodeProblem) -> dict[str, Any]:
            return own

    (t0,) = Population.create(1, 1).teachers
    proposals = [_proposal("deduction", t0, "def f(a): return a", ["1"])]
    write = lambda: problem_records(1, proposals, {t0.id: Match(t0.id, "s0")}, {"deduction": _Writes()})  # noqa: E731
    if clash is None:
        assert write()[0]["note"] == "ok"
    else:
        with pytest.raises(PluginError, match=rf"task 'deduction': its record_fields has fields .*\({clash}\)"):
            write()
