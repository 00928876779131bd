"""The arithmetic world (``populora_arith``) without its base model: the grammar and its counted invalid reasons,
rewards, levels and carries on hand-checked sums, the task's state and problem records, and the held-out
evaluator's overlap refusal and grading of reversed answers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from populora_arith import heldout, world
from populora_arith.heldout import ArithHeldout, HeldoutParams
from populora_arith.task import ArithProblem, ArithTask

from populora_core.api import UserError, get_registry


def _task(**params) -> ArithTask:
    return get_registry().get("task", "arith").build(params, executor=None, rng=0, tasks={})


def test_registered_with_its_params_checked():
    task = _task(seed_levels=[2, 4], seed_per_level=3)
    assert isinstance(task, ArithTask) and task.name == "arith"
    assert [world.level(p.a, p.b) for p in task.buffer] == [2, 2, 2, 4, 4, 4]
    with pytest.raises(UserError, match="seed_levels"):
        _task(seed_levels=[7])
    with pytest.raises(UserError, match="unknown"):
        _task(digits=3)


@pytest.mark.parametrize(
    ("text", "a", "b"),
    [("12+34", 12, 34), ("0+0", 0, 0), (" 999999+1;then more", 999999, 1), ("7+30; 8+8", 7, 30)],
)
def test_a_proposal_in_the_grammar_is_a_valid_problem(text, a, b):
    (problem,) = _task().parse_proposals([text], [[1]], ["t0@v1"])
    assert (problem.valid, problem.a, problem.b, problem.question) == (True, a, b, f"{a}+{b}")
    assert problem.proposer == "t0@v1" and problem.error is None


def test_proposals_outside_the_grammar_are_invalid_with_their_reasons_counted_then_reset():
    task = _task()
    texts = ["012+3", "1+00", "1234567+1", "1+9999999", "12-3", "a+b", "", "1+2+3", "+5", "12+34"]
    problems = task.parse_proposals(texts, [[1]] * len(texts), ["t0@v1"] * len(texts))
    assert [p.error for p in problems] == [
        "leading zero",
        "leading zero",
        "over 6 digits",
        "over 6 digits",
        "not a+b",
        "not a+b",
        "not a+b",
        "not a+b",
        "not a+b",
        None,
    ]
    assert [p.valid for p in problems] == [False] * 9 + [True]
    assert problems[0].question == "012+3" and problems[0].proposer == "t0@v1"  # what the teacher wrote, kept
    metrics = task.proposer_metrics([[1, 2], [3]])
    assert metrics == {
        "reference_level": 2.0,
        "invalid/leading zero": 2,
        "invalid/not a+b": 5,
        "invalid/over 6 digits": 2,
    }
    assert task.proposer_metrics([[4]]) == {"reference_level": 4.0}  # counted once: the next step starts at zero
    task.parse_proposals(["1+01"], [[1]], ["t0@v2"])
    assert task.proposer_metrics([]) == {"reference_level": None, "invalid/leading zero": 1}


def test_student_rewards_right_wrong_and_unformatted():
    task = _task()
    problem = task._problem(12, 39, "t0@v1")  # 51, written least significant digit first: 15
    grades = task.grade(problem, ["15", " 15\n", "51", "150", "fifteen", "", "-15"])
    assert [g.correct for g in grades] == [True, True, False, False, False, False, False]
    assert [g.formatted for g in grades] == [True, True, True, True, False, False, False]
    assert [g.reward for g in grades] == [1.0, 1.0, -0.5, -0.5, -1.0, -1.0, -1.0]
    own = _task(solver_correct=2.0, solver_wrong=-0.25, solver_format=-3.0)
    assert [g.reward for g in own.grade(problem, ["15", "51", "x"])] == [2.0, -0.25, -3.0]


def test_teacher_rewards_learnability_unsolved_solved_and_invalid():
    task = _task()
    problem = task._problem(12, 39, "t0@v1")
    assert task.proposer_reward(problem, 0.25) == pytest.approx(0.75)
    assert task.proposer_reward(problem, 0.875) == pytest.approx(0.125)
    assert task.proposer_reward(problem, 0.0) == -0.5
    assert task.proposer_reward(problem, 1.0) == -0.5
    assert task.proposer_reward(problem, None) == -1.0
    own = _task(unsolved_reward=-0.2, solved_reward=-0.3, invalid_reward=-2.0)
    assert [own.proposer_reward(problem, r) for r in (0.0, 1.0, None, 0.5)] == [-0.2, -0.3, -2.0, 0.5]


@pytest.mark.parametrize(
    ("a", "b", "level", "carries", "answer"),
    [
        (0, 0, 1, "0", "0"),
        (4, 5, 1, "0", "9"),
        (5, 5, 1, "1", "01"),
        (9, 10, 2, "00", "91"),
        (15, 5, 2, "10", "02"),
        (5, 95, 2, "11", "001"),
        (12, 39, 2, "10", "15"),
        (999, 1, 3, "111", "0001"),
        (1234, 4321, 4, "0000", "5555"),
        (100000, 99, 6, "000000", "990001"),
        (999999, 999999, 6, "111111", "8999991"),
        (909090, 90909, 6, "000000", "999999"),
        (505050, 50505, 6, "000000", "555555"),
        (19, 81, 2, "11", "001"),
    ],
)
def test_levels_carries_and_reversed_answers_on_hand_checked_sums(a, b, level, carries, answer):
    assert world.level(a, b) == level == world.level(b, a)
    assert world.carries(a, b) == carries == world.carries(b, a)
    assert world.answer(a, b) == answer
    problem = _task()._problem(a, b, "t0@v1")
    assert problem.metrics == {"level": level} and problem.signature == f"L{level}:{carries}"
    assert _task().difficulty(problem) == level


def test_the_task_declares_its_levels_as_its_difficulty():
    task = _task()
    assert task.difficulty_levels == (1, 2, 3, 4, 5, 6) == world.LEVELS
    assert task.teacher_metrics == ()  # member/<t>/difficulty says it; no second copy as member/<t>/level
    (problem,) = task.parse_proposals(["123+4"], [[1]], ["t0@v1"])
    assert task.difficulty(problem) == 3
    assert task.problem_metrics([problem, task._problem(1, 2, "x")]) == {
        f"proposals_at_level/{lv}": {1: 1, 3: 1}.get(lv, 0) for lv in world.LEVELS
    }


def test_draw_gives_problems_of_the_level_asked():
    rng = random.Random(0)
    for lv in world.LEVELS:
        for _ in range(50):
            a, b = world.draw(lv, rng)
            assert world.level(a, b) == lv and world.parse_question(world.question(a, b)) == (a, b)


def test_state_dict_round_trip_through_json():
    task = _task(seed_levels=[1, 5], seed_per_level=2)
    task.add_to_buffer(task.parse_proposals(["12+34", "01+2", "99+1"], [[1]] * 3, ["t1@v3"] * 3))
    assert len(task.buffer) == 6  # the invalid one stays out
    state = json.loads(json.dumps(task.state_dict()))
    other = _task(seed_levels=[3], seed_per_level=1)
    other.load_state_dict(state)
    assert other.buffer == task.buffer
    assert [p.proposer for p in other.buffer] == ["seed"] * 4 + ["t1@v3"] * 2
    assert other.sample_problems(2, random.Random(0)) == [task.buffer[-1], task.buffer[-2]]  # recent first


def _record(**fields):
    return {"task_type": "arith", **fields}


def test_load_problem_reads_a_record_and_fills_in_its_question():
    task = _task()
    problem = task.load_problem(_record(a=120, b=7))
    assert isinstance(problem, ArithProblem)
    assert (problem.question, problem.valid, problem.metrics, problem.proposer) == ("120+7", True, {"level": 3}, "file")
    assert task.load_problem(_record(a=1, b=2, question="1+2", proposer="t0@v1")).proposer == "t0@v1"


@pytest.mark.parametrize(
    ("record", "error", "message"),
    [
        (_record(a=-1, b=2), ValueError, "non-negative"),
        (_record(a=3, b=-20), ValueError, "non-negative"),
        (_record(a=True, b=2), TypeError, "integers"),
        (_record(a=1, b=False), TypeError, "integers"),
        (_record(a=1.0, b=2), TypeError, "integers"),
        (_record(a="1", b=2), TypeError, "integers"),
        (_record(a=None, b=2), TypeError, "integers"),
        (_record(b=2), TypeError, "integers"),
        (_record(a=1234567, b=1), ValueError, "over 6 digits"),
        (_record(a=1, b=2, question="1+3"), ValueError, "question '1\\+3' is not '1\\+2'"),
        (_record(a=1, b=2, question="01+2"), ValueError, "is not '1\\+2'"),
    ],
)
def test_load_problem_refuses_bad_records(record, error, message):
    with pytest.raises(error, match=message):
        _task().load_problem(record)


def _jsonl(path: Path, pairs: list[tuple[int, int]]) -> Path:
    path.write_text("".join(json.dumps(_record(a=a, b=b, question=world.question(a, b))) + "\n" for a, b in pairs))
    return path


@pytest.fixture
def probe_file(tmp_path, monkeypatch):
    """A probe set of three problems standing in for the shipped one (which the model's build writes)."""
    probe = _jsonl(tmp_path / "probe.jsonl", [(12, 34), (5, 5), (123456, 654321)])
    monkeypatch.setattr(heldout, "PROBE_FILE", probe)
    return probe


def test_a_held_out_file_sharing_a_problem_with_the_probe_is_refused_naming_it(tmp_path, probe_file):
    held = _jsonl(tmp_path / "held.jsonl", [(1, 2), (12, 34), (40, 2), (123456, 654321)])
    evaluator = ArithHeldout(HeldoutParams(path=str(held)))
    with pytest.raises(UserError, match="is not held out") as refused:
        evaluator.items()
    message = str(refused.value)
    assert f"2 with the probe set {probe_file} (12+34, 123456+654321)" in message
    assert "1+2" not in message and "40+2" not in message


def test_the_overlap_lists_five_shared_problems_and_how_many_more():
    shared = [(i, 1) for i in range(7)]
    found = heldout.overlap([*shared, (50, 50)], {"the corpus": shared, "the probe": [(50, 50)], "other": [(3, 3)]})
    assert found == "7 with the corpus (0+1, 1+1, 2+1, 3+1, 4+1, ...); 1 with the probe (50+50)"
    assert heldout.overlap([(1, 1)], {"the probe": [(2, 2)]}) is None


def test_the_evaluator_orders_items_across_levels_and_grades_reversed_answers(tmp_path, probe_file):
    pairs = [(1, 2), (3, 4), (12, 39), (999, 1), (45, 6)]
    evaluator = ArithHeldout(HeldoutParams(path=str(_jsonl(tmp_path / "held.jsonl", pairs))))
    items = evaluator.items()
    assert [(i["id"], i["a"], i["b"]) for i in items] == [
        ("L1/0", 1, 2),
        ("L2/0", 12, 39),
        ("L3/0", 999, 1),
        ("L1/1", 3, 4),
        ("L2/1", 45, 6),
    ]
    assert evaluator.items(limit=3) == items[:3]
    assert evaluator.prompt(items[1]) == "12+39="
    grades = evaluator.grade(items[:3], [["3", " 3\n", "03"], ["15", "51", ""], ["0001", "1000", "1"]])
    assert grades == [[True, True, False], [True, False, False], [True, False, False]]


def test_a_held_out_file_outside_the_grammar_is_a_user_error_naming_the_line(tmp_path, probe_file):
    held = _jsonl(tmp_path / "held.jsonl", [(1, 2)])
    held.write_text(held.read_text() + json.dumps(_record(a=1234567, b=1)) + "\n")
    with pytest.raises(UserError, match=r"held\.jsonl:2: not an arith problem \(over 6 digits\)"):
        ArithHeldout(HeldoutParams(path=str(held))).items()
    with pytest.raises(UserError, match="no problem file"):
        ArithHeldout(HeldoutParams(path=str(tmp_path / "missing.jsonl"))).items()


def test_the_shipped_held_out_and_probe_sets_are_what_the_build_draws_disjoint_and_every_level():
    from populora_arith import HELDOUT_FILE, PROBE_FILE

    from benchmarks.research.arith.make_model import HELDOUT_PER_LEVEL, PROBE_PER_LEVEL, _records, held_out_sets

    heldout, probe = held_out_sets(20261204)
    assert HELDOUT_FILE.read_text() == _records(heldout) and PROBE_FILE.read_text() == _records(probe)
    assert not set(heldout) & set(probe) and len(set(heldout)) == len(heldout) == 640
    assert {lv: sum(world.level(*p) == lv for p in heldout) for lv in world.LEVELS} == HELDOUT_PER_LEVEL
    assert {lv: sum(world.level(*p) == lv for p in probe) for lv in world.LEVELS} == dict.fromkeys(
        world.LEVELS, PROBE_PER_LEVEL
    )


def test_the_bases_training_stream_never_draws_a_held_out_or_probe_problem():
    from benchmarks.research.arith.make_model import Stream, held_out_sets

    heldout, probe = held_out_sets(20261204)
    excluded = set(heldout) | set(probe)
    stream = Stream(0, excluded, {1: 1.0, 2: 1.0}, 0.5)
    drawn = [stream.problem(1) for _ in range(2000)]
    assert not set(drawn) & excluded and len(set(drawn)) == 100 - 40 - 20  # level 1: every other problem, only those
