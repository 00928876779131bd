"""PFSP matchmaking on TrueSkill ratings, the outcome rule, and the PBT selection schemes."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from populora_matchmaking import PFSPParams, TieredParams, TournamentParams, TruncationParams
from populora_matchmaking.matchmakers import PFSP, RoundRobin, expected_solve_rate
from populora_matchmaking.selectors import Tiered, Tournament, Truncation

from populora_core.components import MatchOutcome
from populora_core.population import Population, Rating


def _pop(t: int = 1, s: int = 3) -> Population:
    return Population.create(t, s)


def test_expected_solve_rate_is_the_trueskill_win_probability():
    pop = _pop(1, 1)
    teacher, student = pop.members["t0"], pop.members["s0"]
    assert expected_solve_rate(student, teacher, 25 / 6) == pytest.approx(0.5)
    student.rating = Rating(30.0, 2.0)
    teacher.rating = Rating(25.0, 1.0)
    z = 5.0 / math.sqrt(4 + 1 + 2 * (25 / 6) ** 2)
    assert expected_solve_rate(student, teacher, 25 / 6) == pytest.approx(0.5 * (1 + math.erf(z / math.sqrt(2))))


def test_pfsp_var_weighting_prefers_balanced_students():
    pop = _pop(1, 3)
    pop.members["s0"].rating = Rating(25.0, 1.0)  # p ~ 0.5: balanced
    pop.members["s1"].rating = Rating(60.0, 1.0)  # p ~ 1: too strong
    pop.members["s2"].rating = Rating(-10.0, 1.0)  # p ~ 0: too weak
    pop.members["t0"].rating = Rating(25.0, 1.0)
    mm = PFSP(PFSPParams())
    rng = random.Random(0)
    picks = Counter(mm.pair(pop.teachers, pop.students, rng)[0].student for _ in range(300))
    assert picks["s0"] > 0.9 * 300
    hard = PFSP(PFSPParams(weighting="hard"))
    hard_picks = Counter(hard.pair(pop.teachers, pop.students, rng)[0].student for _ in range(300))
    assert hard_picks.most_common(1)[0][0] in ("s0", "s2") and hard_picks["s1"] < 10


def test_one_to_one_pairing_uses_each_student_once():
    pop = _pop(3, 3)
    matches = PFSP(PFSPParams(pairing="one_to_one")).pair(pop.teachers, pop.students, random.Random(1))
    assert sorted(m.student for m in matches) == ["s0", "s1", "s2"]


def test_outcome_rule_moves_ratings_on_one_scale():
    pop = _pop(1, 1)
    mm = PFSP(PFSPParams())
    members = pop.members
    mm.update_ratings([MatchOutcome("t0", "s0", solve_rate=0.9, expected_solve_rate=0.5)], members)
    assert members["s0"].rating.mu > 25 > members["t0"].rating.mu  # student beat expectation
    before = members["t0"].rating.mu
    mm.update_ratings([MatchOutcome("t0", "s0", solve_rate=0.0, expected_solve_rate=0.5)], members)
    assert members["t0"].rating.mu > before  # teacher stumped the student
    s_before = members["s0"].rating.mu
    mm.update_ratings([MatchOutcome("t0", "s0", solve_rate=None, expected_solve_rate=0.5)], members)
    assert members["s0"].rating.mu > s_before  # no valid problem: the teacher loses
    sigma = members["s0"].rating.sigma
    assert sigma < 25 / 3  # uncertainty shrinks with games


def test_draw_margin_makes_close_results_draws():
    pop = _pop(1, 1)
    mm = PFSP(PFSPParams(draw_margin=0.1))
    mm.update_ratings([MatchOutcome("t0", "s0", solve_rate=0.55, expected_solve_rate=0.5)], pop.members)
    assert pop.members["s0"].rating.mu == pytest.approx(pop.members["t0"].rating.mu)


def test_round_robin_rotates_and_resumes():
    pop = _pop(2, 2)
    rr = RoundRobin(PFSPParams())
    first = [(m.teacher, m.student) for m in rr.pair(pop.teachers, pop.students, None)]
    second = [(m.teacher, m.student) for m in rr.pair(pop.teachers, pop.students, None)]
    assert first == [("t0", "s0"), ("t1", "s1")] and second == [("t0", "s1"), ("t1", "s0")]
    clone = RoundRobin(PFSPParams())
    clone.load_state_dict(rr.state_dict())
    assert (
        clone.pair(pop.teachers, pop.students, None)[0].student == rr.pair(pop.teachers, pop.students, None)[0].student
    )


def _rated(n: int) -> list:
    pop = Population.create(0, n) if n else Population()
    members = list(pop.members.values()) if n else []
    for i, m in enumerate(members):
        m.rating = Rating(10.0 + i, 1.0)  # s{n-1} is best
    return members


def test_truncation_replaces_the_bottom_by_children_of_survivors():
    members = _rated(8)
    reps = Truncation(TruncationParams(fraction=0.25)).select(members, random.Random(0))
    assert sorted(r.dead for r in reps) == ["s0", "s1"]
    for r in reps:
        assert len(r.parents) == 2 and not set(r.parents) & {"s0", "s1"}
    # at least one replaced, always one survivor
    two = _rated(2)
    assert [r.dead for r in Truncation(TruncationParams(fraction=0.9)).select(two, random.Random(0))] == ["s0"]


def test_conservative_rating_ranks_uncertain_members_low():
    members = _rated(3)
    members[2].rating = Rating(30.0, 8.0)  # highest mu but very uncertain: mu - 3 sigma = 6
    reps = Truncation(TruncationParams(fraction=0.3)).select(members, random.Random(0))
    assert [r.dead for r in reps] == ["s2"]


def test_tournament_and_tiered():
    members = _rated(6)
    reps = Tournament(TournamentParams(fraction=0.34, size=3)).select(members, random.Random(3))
    assert len(reps) == 2 and len({r.dead for r in reps}) == 2
    assert all(r.dead not in r.parents for r in reps)
    tiers = Tiered(TieredParams(keep=0.34, mutate=0.33)).select(members, random.Random(0))
    in_place = [r for r in tiers if r.parents == [r.dead]]
    replaced = [r for r in tiers if r.parents != [r.dead]]
    assert sorted(r.dead for r in in_place) == ["s2", "s3"]
    assert sorted(r.dead for r in replaced) == ["s0", "s1"]
    assert all(r.mutation_only for r in tiers) and all(p in ("s4", "s5") for r in replaced for p in r.parents)
    with pytest.raises(ValueError, match="keep \\+ mutate"):
        TieredParams(keep=0.7, mutate=0.5)


# --- selection that compares like with like ---------------------------------------------------------------


def _nano_selection(trials: int, **settings):
    from populora_matchmaking.simulation import selection_study

    base = {
        "matchmaker": PFSP(PFSPParams()),
        "selector": Truncation(TruncationParams(fraction=0.5, conservative_k=3)),
        "teachers": 2,
        "students": 2,
        "every": 4,
        "steps": 32,
    }
    return selection_study(trials, **{**base, **settings})


def test_a_child_and_a_veteran_of_equal_skill_are_each_replaced_about_half_the_time():
    """nano's 2T-2S, every 4 steps: at each replacement after the first, one child and one veteran per role."""
    study = _nano_selection(30)
    assert study["replacements_after_first"] == 30 * 12
    assert study["youngest_share_by_chance"] == pytest.approx(0.5)
    assert 0.35 <= study["youngest_share"] <= 0.65
    assert study["survivor_change_share"] >= 0.3
    # the prior rating (sigma 8.33) under mu - 3 sigma: the newest child is almost always the one that dies
    fresh = _nano_selection(30, child_policy="fresh")
    assert fresh["youngest_share"] >= 0.75 and fresh["survivor_change_share"] <= 0.25


def test_a_child_that_outplays_the_veteran_survives_it():
    better = _nano_selection(30, child_skill=lambda parent, rng: parent + 2 * 25 / 6)
    assert better["youngest_share"] <= 0.15
    assert better["weakest_share"] >= 0.85


def test_selection_replaces_the_weakest_more_often_than_chance_when_skills_differ():
    study = _nano_selection(
        30, skill=lambda rng: rng.gauss(0, 25 / 6), child_skill=lambda p, rng: p + rng.gauss(0, 25 / 6)
    )
    assert study["weakest_share"] >= 0.65  # chance: 0.5


def test_only_ready_members_are_replaced():
    from populora_core.operators import ready_ids, select

    members = _rated(4)  # s0 is the worst
    members[0].born_step = 6
    assert ready_ids(members, 8, 4) == {"s1", "s2", "s3"}
    reps = select(Truncation(TruncationParams(fraction=0.5)), members, random.Random(0), {"s1", "s2", "s3"})
    assert [r.dead for r in reps] == ["s1"]  # the bottom half is s0 (not ready) and s1
    assert Tiered(TieredParams(keep=0.25, mutate=0.25)).select(members, random.Random(0), ready=set()) == []
    assert all(
        r.dead != "s0"
        for r in Tournament(TournamentParams(fraction=0.5)).select(members, random.Random(1), {"s1", "s2", "s3"})
    )


def test_a_selector_that_ignores_readiness_is_refused():
    from populora_core import PluginError
    from populora_core.operators import select

    class Old:  # written before `ready` existed: called without it
        def select(self, members, rng):
            return Truncation(TruncationParams(fraction=0.5)).select(members, rng)

    members = _rated(4)
    assert sorted(r.dead for r in select(Old(), members, random.Random(0), {"s0", "s1", "s2", "s3"})) == ["s0", "s1"]
    with pytest.raises(PluginError, match="'s0', which is not ready"):
        select(Old(), members, random.Random(0), {"s1", "s2", "s3"})


def test_selection_history_counts_youngest_replacements_and_survivor_changes():
    from populora_core.population import selection_history

    def child(step, member, replaced, role="student"):
        return {"step": step, "member": member, "role": role, "replaced": replaced}

    lineage = [
        {"step": 0, "member": "s0", "role": "student"},
        {"step": 0, "member": "s1", "role": "student"},
        child(4, "s2", "s1"),  # first evolution: not counted (no younger member yet)
        child(8, "s3", "s2"),  # the youngest (s2) dies: survivors {s0} again
        child(12, "s4", "s0"),  # the veteran dies: survivors {s3}
    ]
    history = selection_history(lineage)
    assert history == {
        "replacements_after_first": 2,
        "youngest_replaced": 1,
        "youngest_replaced_by_chance": 1.0,
        "survivor_changes": 1,
        "survivor_comparisons": 2,
    }
