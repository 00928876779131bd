"""PFSP matchmaking on TrueSkill ratings, the outcome rule, and the PBT selection schemes."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from populora_matchmaking import PFSPParams, TieredParams, TournamentParams, TruncationParams
from populora_matchmaking.matchmakers import PFSP, RoundRobin, expected_solve_rate
from populora_matchmaking.selectors import Tiered, Tournament, Truncation

from populora_core.api.components import MatchOutcome
from populora_core.api.population import Population, Rating


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


def _after(mode: str, problem_rates: list, p: float = 0.5) -> tuple[float, float]:
    """(teacher mu, student mu) after one match from the prior (25, 25) with these per-proposal solve rates."""
    pop = _pop(1, 1)
    valid = [r for r in problem_rates if r is not None]
    mean = sum(valid) / len(valid) if valid else None
    PFSP(PFSPParams(teacher_outcome=mode)).update_ratings(
        [MatchOutcome("t0", "s0", mean, p, problem_rates)], pop.members
    )
    return pop.members["t0"].rating.mu, pop.members["s0"].rating.mu


@pytest.mark.parametrize(
    ("mode", "rates", "teacher", "student"),
    [
        # a student that beats expectation wins, one below it loses, in both settings
        ("zero_sum", [0.9, 0.9], "down", "up"),
        ("reward", [0.9, 0.9], "down", "up"),
        ("zero_sum", [0.2, 0.2], "up", "down"),
        ("reward", [0.2, 0.2], "up", "down"),
        # nobody solved anything: a teacher win on the paper's scale; under reward nobody's win (a draw)
        ("zero_sum", [0.0, 0.0], "up", "down"),
        ("reward", [0.0, 0.0], "same", "same"),
        # two unsolved problems beside an easy one: a teacher win by the mean (0.3); under reward the unsolved
        # ones count as the expectation, (0.5 + 0.5 + 0.9) / 3 > 0.5, and the easy problem decides: a loss
        ("zero_sum", [0.0, 0.0, 0.9], "up", "down"),
        ("reward", [0.0, 0.0, 0.9], "down", "up"),
        # everyone solved everything, or no valid problem: the teacher loses in both
        ("zero_sum", [1.0, 1.0], "down", "up"),
        ("reward", [1.0, 1.0], "down", "up"),
        ("zero_sum", [None, None], "down", "up"),
        ("reward", [None, None], "down", "up"),
    ],
)
def test_each_teacher_outcome_setting_moves_ratings_as_documented(mode, rates, teacher, student):
    moved = {"up": lambda mu: mu > 25, "down": lambda mu: mu < 25, "same": lambda mu: mu == pytest.approx(25)}
    t_mu, s_mu = _after(mode, rates)
    assert moved[teacher](t_mu) and moved[student](s_mu), (t_mu, s_mu)


def test_the_default_teacher_outcome_is_the_reward_and_ratings_shrink_sigma():
    assert PFSPParams().teacher_outcome == "reward"
    pop = _pop(1, 1)
    PFSP(PFSPParams()).update_ratings([MatchOutcome("t0", "s0", 0.0, 0.5, [0.0])], pop.members)
    assert pop.members["s0"].rating.sigma < 25 / 3 and pop.members["t0"].rating.sigma < 25 / 3  # a draw informs


@pytest.mark.parametrize("mode", ["zero_sum", "reward"])
def test_invalid_proposals_count_against_a_teacher_in_proportion(mode):
    """Each invalid proposal counts as a problem the student solved: one of six moves the teacher's solve rate by
    1/6 of the way to 1, not only when all six are invalid."""
    from populora_matchmaking.matchmakers import match_solve_rate

    for invalid in range(7):
        rates = [0.2] * (6 - invalid) + [None] * invalid
        valid = rates[: 6 - invalid]
        outcome = MatchOutcome("t0", "s0", sum(valid) / len(valid) if valid else None, 0.5, rates)
        assert match_solve_rate(outcome, mode) == pytest.approx((0.2 * (6 - invalid) + invalid) / 6)
    # 2 of 6 invalid, the rest stumping the student: still a win (rate 0.47 < 0.5); 3 of 6: a loss (0.6)
    assert _after(mode, [0.2] * 4 + [None] * 2)[0] > 25
    assert _after(mode, [0.2] * 3 + [None] * 3)[0] < 25


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
    reps = Truncation(TruncationParams(fraction=0.3, conservative_k=3)).select(members, random.Random(0))
    assert [r.dead for r in reps] == ["s2"]
    by_mu = Truncation(TruncationParams(fraction=0.3)).select(members, random.Random(0))  # default k = 0
    assert [r.dead for r in by_mu] == ["s0"]


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


def test_only_ready_members_are_replaced_and_readiness_counts_rated_matches():
    from populora_core.api.operators import count_matches, ready_ids, select

    members = _rated(4)  # s0 is the worst
    for m in members:
        m.counters.matches = 8
    members[0].counters.matches = 3  # a child that has played 3 matches
    assert ready_ids(members, 8) == {"s1", "s2", "s3"}
    # the bottom quarter is s0, not ready: the cut passes to the worst ready member
    reps = select(Truncation(TruncationParams(fraction=0.25)), members, random.Random(0), {"s1", "s2", "s3"})
    assert [r.dead for r in reps] == ["s1"]  # an unready member may still be a parent
    assert Tiered(TieredParams(keep=0.25, mutate=0.25)).select(members, random.Random(0), ready=set()) == []
    assert all(
        r.dead != "s0"
        for r in Tournament(TournamentParams(fraction=0.5)).select(members, random.Random(1), {"s1", "s2", "s3"})
    )
    pop = {m.id: m for m in members} | {"t0": Population.create(1, 0).members["t0"]}
    count_matches(pop, [MatchOutcome("t0", "s0", 0.5), MatchOutcome("t0", "s1", None)])
    assert pop["t0"].counters.matches == 2 and members[0].counters.matches == 4  # s0 solved a problem
    assert members[1].counters.matches == 8  # s1 had no valid problem to solve: no match played


def test_default_readiness_outlasts_the_interval():
    """Readiness used to count steps lived, with the interval as default: a child born at one evolution step
    had always lived `every` steps at the next, so it never mattered. It counts rated matches now, twice the
    interval by default (a teacher plays one a step)."""
    from populora_core.api.schema import EvolutionSection

    assert EvolutionSection(every=4).readiness == 8 > 4
    assert EvolutionSection(every=4, ready_after=3).readiness == 3


@pytest.mark.parametrize(
    ("policy", "mu", "sigma"),
    [
        ("inherit", 30.0, 1.0),  # the first parent's rating, its certainty too
        ("fresh", 25.0, 25 / 3),  # the prior
        ("widen", 28.0, (1.5**2 + 2.0**2) ** 0.5),  # the parents' mean mu, their mean sigma widened by 2
    ],
)
def test_a_childs_first_rating(policy, mu, sigma):
    from populora_core.api.operators import child_rating

    child = child_rating([Rating(30.0, 1.0), Rating(26.0, 2.0)], policy, 2.0, prior=Rating())
    assert child.mu == pytest.approx(mu) and child.sigma == pytest.approx(sigma)
    assert child_rating([Rating(30.0, 8.0)], "widen", 25 / 6, prior=Rating()).sigma == pytest.approx(25 / 3)  # the cap


def test_pfsps_mu_and_sigma_are_the_prior_of_every_new_member():
    """The prior is pfsp's params: a new run's members start there, a fresh child too, a widened one's sigma stops
    at it; the defaults are TrueSkill's, stated once (``populora_core.api.population``)."""
    from populora_core.api.operators import child_rating
    from populora_core.api.population import PRIOR_MU, PRIOR_SIGMA

    assert PFSP(PFSPParams()).prior() == Rating() == Rating(PRIOR_MU, PRIOR_SIGMA) == Rating(25.0, 25 / 3)
    mm = PFSP(PFSPParams(mu=100.0, sigma=4.0))
    pop = Population.create(2, 2, prior=mm.prior())
    assert {(m.rating.mu, m.rating.sigma) for m in pop.members.values()} == {(100.0, 4.0)}
    pop.members["t0"].rating.mu = 90.0  # each member its own rating
    assert pop.members["t1"].rating.mu == 100.0 and mm.prior().mu == 100.0
    assert child_rating([Rating(30.0, 1.0)], "fresh", 2.0, prior=mm.prior()) == Rating(100.0, 4.0)
    assert child_rating([Rating(30.0, 3.9)], "widen", 2.0, prior=mm.prior()).sigma == 4.0
    assert mm.env.mu == 100.0 and mm.env.sigma == 4.0  # the scale the ratings move on


def test_a_selector_that_ignores_readiness_is_refused():
    from populora_core import PluginError
    from populora_core.api.operators import select

    class Old:  # written before `ready` existed: called without it
        def select(self, members, rng):
            return Truncation(TruncationParams(fraction=0.5)).select(members, rng)

    members = _rated(4)
    assert sorted(r.dead for r in select(Old(), members, random.Random(0), {"s0", "s1", "s2", "s3"})) == ["s0", "s1"]
    with pytest.raises(PluginError, match="'s0', which is not ready"):
        select(Old(), members, random.Random(0), {"s1", "s2", "s3"})


def test_selection_history_counts_youngest_replacements_and_survivor_changes():
    from populora_core.services.statistics import selection_history

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


# --- who plays whom, and what a match reports -------------------------------------------------------------


def _matchmaker(name: str, **params):
    from populora_core import get_registry

    return get_registry().get("matchmaker", name).build(params)


@pytest.mark.parametrize("name", ["pfsp", "round_robin", "random"])
def test_no_student_idles_where_teachers_are_at_least_students(name):
    """Property over seeds: random sizes with teachers >= students and random ratings; every student is drawn,
    every teacher has one student, and with as many teachers as students each student exactly once."""
    for seed in range(60):
        rng = random.Random(seed)
        students = rng.randint(1, 6)
        teachers = rng.randint(students, 8)
        pop = Population.create(teachers, students)
        for m in pop.members.values():
            m.rating = Rating(rng.uniform(10, 40), rng.uniform(0.5, 8))
        mm = _matchmaker(name)
        for _ in range(3):
            matches = mm.pair(pop.teachers, pop.students, rng)
            assert [m.teacher for m in matches] == [t.id for t in pop.teachers]
            drawn = Counter(m.student for m in matches)
            assert set(drawn) == {s.id for s in pop.students}, (seed, teachers, students, drawn)
            assert max(drawn.values()) - min(drawn.values()) <= 1  # rounds: nobody drawn twice before all once


def test_many_to_one_pairing_can_idle_a_student():
    """The alternative the default replaced: each teacher draws on its own (the quickstart idled 18 of 64
    student-steps this way)."""
    pop = Population.create(2, 2)
    mm = _matchmaker("pfsp", pairing="many_to_one")
    rng = random.Random(0)
    idle = sum(len({m.student for m in mm.pair(pop.teachers, pop.students, rng)}) < 2 for _ in range(100))
    assert idle > 20


def test_a_match_reports_each_proposals_rate_with_invalid_ones_as_none():
    """phases.rate: per generated proposal its solve rate (None if invalid); dropped completions are nobody's."""
    from types import SimpleNamespace

    from populora_core.api.components import Completion, Match, Problem
    from populora_core.run import phases
    from populora_core.run.proposals import Proposal

    pop = Population.create(1, 1)
    teacher = pop.members["t0"]

    def proposal(valid: bool, rate: float | None, finish: str = "stop") -> Proposal:
        done = Completion("x", [1], [0.0], [1], finish_reason=finish)
        return Proposal("deduction", teacher, None, done, Problem("deduction", valid=valid), rate)

    proposals = [
        proposal(True, 0.5),
        proposal(True, 0.0),
        proposal(False, None),
        proposal(False, None, "prompt_too_long"),
    ]
    c = SimpleNamespace(
        recipe=SimpleNamespace(population=SimpleNamespace(single_agent=False)), matchmaker=PFSP(PFSPParams())
    )
    (outcome,) = phases.rate(c, pop, [Match("t0", "s0", 0.5)], proposals)
    assert outcome.problem_rates == [0.5, 0.0, None] and outcome.solve_rate == 0.25
    assert teacher.counters.matches == 1 and pop.members["s0"].counters.matches == 1
    assert teacher.rating.mu < 25  # reward: the unsolved one counts as expected, (0.5 + 0.5 + 1) / 3 > 0.5
