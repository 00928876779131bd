"""The selection simulation (``benchmarks/research/selection_simulation.py``, what ``python -m
benchmarks.research.selection`` runs on every recipe): selection that compares like with like."""

from __future__ import annotations

import pytest
from populora_matchmaking import PFSPParams, TruncationParams
from populora_matchmaking.matchmakers import PFSP
from populora_matchmaking.selectors import Truncation

from populora_core.api.schema import EvolutionSection


def _study_selection(trials: int, **settings):
    """The study recipes' selection (nano_study.yaml): 4T-4S, a quarter replaced every 4 steps, ranked by mu,
    children widened and ready after 2 x every = 8 rated matches."""
    from benchmarks.research.selection_simulation import selection_study

    base = {
        "matchmaker": PFSP(PFSPParams()),
        "selector": Truncation(TruncationParams(fraction=0.25)),
        "teachers": 4,
        "students": 4,
        "evolution": EvolutionSection(every=4),
        "steps": 60,
    }
    return selection_study(trials, **{**base, **settings})


def test_a_widened_child_is_protected_then_judged_about_as_chance_says():
    """Equal skills: the newest child is never replaced at the selection after its birth (ready_after), and once
    ready the youngest dies about as often as chance; under mu - 3 sigma its wider sigma would doom it."""
    study = _study_selection(8)
    assert study["youngest_share"] == 0 and study["replacements_after_first"] > 0
    assert abs(study["youngest_ready_share"] - study["youngest_ready_share_by_chance"]) <= 0.15, study
    assert study["survivor_change_share"] >= 0.9
    doomed = _study_selection(8, selector=Truncation(TruncationParams(fraction=0.25, conservative_k=3)))
    assert doomed["youngest_ready_share"] >= doomed["youngest_ready_share_by_chance"] + 0.4, doomed
    unprotected = _study_selection(8, evolution=EvolutionSection(every=4, ready_after=0))  # may die at once
    assert unprotected["youngest_share"] > 0.1


def test_a_child_that_outplays_its_elders_survives_them():
    better = _study_selection(8, child_skill=lambda parent, rng: parent + 2 * 25 / 6)
    assert better["youngest_ready_share"] <= 0.15  # chance: 1/3
    assert better["weakest_share"] >= 0.5  # chance: 1/4


def test_selection_replaces_the_weakest_more_often_than_chance_when_skills_differ():
    study = _study_selection(
        12, skill=lambda rng: rng.gauss(0, 25 / 6), child_skill=lambda p, rng: p + rng.gauss(0, 25 / 6)
    )
    assert study["weakest_share_by_chance"] == 0.25  # one of four replaced per role
    assert study["weakest_share"] >= 0.45


def test_the_selection_benchmarks_detectable_effect_is_the_binomial_one():
    """100 replacements at a chance share of 0.5: (1.960 + 0.842) x 0.5 / 10 = 0.140."""
    from benchmarks.research.selection import share_mde

    assert share_mde(0.5, 100) == pytest.approx(0.1401, abs=1e-4)
    assert share_mde(0.25, 0) is None
