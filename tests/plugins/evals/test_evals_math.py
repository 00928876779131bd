"""math-verify grading on the real shipped data: every gold answer right, perturbed answers wrong."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("math_verify")


def bench(name):
    from populora_evals.evaluators import BENCHMARKS, EvaluatorParams

    return BENCHMARKS[name](EvaluatorParams(source="shipped"))  # aime25: MMATH's AIME I


def perturb(answer: str) -> str:
    """A wrong answer: a number plus one, else the expression plus one."""
    plain = answer.replace(",", "")
    if re.fullmatch(r"-?\d+", plain):
        return str(int(plain) + 1)
    if re.fullmatch(r"-?\d*\.\d+", plain):
        return repr(float(plain) + 1)
    return f"{answer}+1"


def azr(answer: str) -> str:
    return f" I computed it. </think> <answer>\\boxed{{{answer}}}</answer>"


@pytest.mark.slow
@pytest.mark.parametrize("name,count", [("math500", 500), ("gsm8k", 1319), ("aime24", 30), ("aime25", 15)])
def test_gold_right_and_perturbed_wrong(name, count):
    b = bench(name)
    items = b.items()
    assert len(items) == count
    result = b.grade(items, [[azr(it["answer"]), azr(perturb(it["answer"]))] for it in items])
    gold_wrong = [it["id"] for it, r in zip(items, result) if not r[0]]
    perturbed_right = [(it["id"], it["answer"]) for it, r in zip(items, result) if r[1]]
    assert gold_wrong == []
    assert perturbed_right == []


def test_gold_right_in_every_template():
    for template, wrap in (
        ("azr", azr),
        ("azr_boxed", azr),
        ("qwen-boxed", lambda a: f"Step by step... so the result is $\\boxed{{{a}}}$."),
    ):
        from populora_evals.evaluators import BENCHMARKS, EvaluatorParams

        b = BENCHMARKS["math500"](EvaluatorParams(template=template))
        items = b.items(25)
        assert all(r == [True] for r in b.grade(items, [[wrap(it["answer"])] for it in items])), template
