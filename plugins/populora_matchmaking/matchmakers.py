"""Matchmakers: who teaches whom this step, and how a match moves the ratings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from populora_core.api.components import Match, Matchmaker, MatchOutcome
from populora_core.api.population import Rating

if TYPE_CHECKING:
    from . import PFSPParams, RatedParams


def expected_solve_rate(student: Any, teacher: Any, beta: float) -> float:
    """p = Phi((mu_s - mu_t) / sqrt(sigma_s^2 + sigma_t^2 + 2 beta^2)) on the shared scale."""
    s, t = student.rating, teacher.rating
    z = (s.mu - t.mu) / math.sqrt(s.sigma**2 + t.sigma**2 + 2 * beta**2)
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


class _RatedMatchmaker(Matchmaker):
    """Shared TrueSkill update: student wins above p, teacher wins below, a draw within the margin."""

    def __init__(self, params: RatedParams) -> None:
        import trueskill

        self.params = params
        self.env = trueskill.TrueSkill(
            mu=params.mu,
            sigma=params.sigma,
            beta=params.beta,
            tau=params.tau,
            draw_probability=params.draw_probability,
        )
        self.beta = self.env.beta

    def prior(self) -> Rating:
        """The params' ``mu`` and ``sigma``: a new member's first rating on this scale."""
        return Rating(self.params.mu, self.params.sigma)

    def expected(self, student: Any, teacher: Any) -> float:
        return expected_solve_rate(student, teacher, self.beta)

    def state_dict(self) -> dict[str, Any] | None:
        return None  # ratings live on the members; only a matchmaker with its own counters has state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def update_ratings(self, outcomes: Sequence[MatchOutcome], members: dict[str, Any]) -> None:
        """One zero-sum game per match on :func:`match_solve_rate` (a draw where it is None): the student wins
        above the expected solve rate, the teacher below, a draw within the margin."""
        mode, margin = self.params.teacher_outcome, self.params.draw_margin
        for o in outcomes:
            teacher, student = members[o.teacher], members[o.student]
            t = self.env.create_rating(teacher.rating.mu, teacher.rating.sigma)
            s = self.env.create_rating(student.rating.mu, student.rating.sigma)
            rate, p = match_solve_rate(o, mode), o.expected_solve_rate
            if rate is None or (abs(rate - p) <= margin and (margin > 0 or rate == p)):
                s, t = self.env.rate_1vs1(s, t, drawn=True)
            elif rate > p:
                s, t = self.env.rate_1vs1(s, t)
            else:
                t, s = self.env.rate_1vs1(t, s)
            teacher.rating.mu, teacher.rating.sigma = t.mu, t.sigma
            student.rating.mu, student.rating.sigma = s.mu, s.sigma


def match_solve_rate(outcome: MatchOutcome, mode: str) -> float | None:
    """The solve rate a match is judged on: the mean over every proposal the teacher generated, one with no usable
    problem counting as solved (a teacher loss, so invalid proposals count in proportion). Under ``reward`` a
    problem nobody solved counts as the expected rate, a win for neither side (the student failed it, and the
    teacher's reward pays it -0.5), and a match of only such problems is a draw (None); under ``zero_sum`` it counts
    0, a teacher win."""
    rates = outcome.problem_rates or [outcome.solve_rate]
    values = [1.0 if r is None else r for r in rates]
    if mode == "reward":
        neutral = sum(v == 0 for v in values)
        if neutral == len(values):
            return None
        return (sum(values) + neutral * outcome.expected_solve_rate) / len(values)
    return sum(values) / len(values)


class PFSP(_RatedMatchmaker):
    """Prioritized fictitious self-play: each teacher draws a student weighted by p(1-p)."""

    params: PFSPParams

    def weight(self, p: float) -> float:
        w = self.params.weighting
        if w == "var":
            return p * (1 - p)
        if w == "hard":
            return (1 - p) ** self.params.hard_exponent
        return 1.0

    def pair(self, teachers: Sequence[Any], students: Sequence[Any], rng: Any) -> list[Match]:
        one_to_one = self.params.pairing == "one_to_one"
        available: list[Any] = []
        chosen: dict[str, Match] = {}
        for teacher in rng.sample(list(teachers), len(teachers)) if one_to_one else teachers:
            if not available or not one_to_one:
                available = list(students)
            probs = [self.expected(s, teacher) for s in available]
            weights = [max(self.weight(p), 1e-12) for p in probs]
            idx = rng.choices(range(len(available)), weights=weights)[0]
            chosen[teacher.id] = Match(teacher.id, available.pop(idx).id, probs[idx])
        return [chosen[t.id] for t in teachers]


class RoundRobin(_RatedMatchmaker):
    """Deterministic rotation; ratings still tracked so selection can use them."""

    def __init__(self, params: RatedParams) -> None:
        super().__init__(params)
        self.calls = 0

    def pair(self, teachers: Sequence[Any], students: Sequence[Any], rng: Any) -> list[Match]:
        offset = self.calls
        self.calls += 1
        return [
            Match(
                t.id,
                students[(i + offset) % len(students)].id,
                self.expected(students[(i + offset) % len(students)], t),
            )
            for i, t in enumerate(teachers)
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = state["calls"]


class RandomMatchmaker(_RatedMatchmaker):
    def pair(self, teachers: Sequence[Any], students: Sequence[Any], rng: Any) -> list[Match]:
        """Rounds of a random permutation of the students: none idles while teachers >= students."""
        drawn: list[Any] = []
        while len(drawn) < len(teachers):
            drawn += rng.sample(list(students), len(students))
        return [Match(t.id, s.id, self.expected(s, t)) for t, s in zip(teachers, drawn)]
