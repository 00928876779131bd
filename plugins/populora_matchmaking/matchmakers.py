"""Matchmakers: who teaches whom this step, and how a match moves the ratings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from populora_core.components import Match, MatchOutcome


def expected_solve_rate(student: Any, teacher: Any, beta: float) -> float:
    """p = Phi((mu_s - mu_t) / sqrt(sigma_s^2 + sigma_t^2 + 2 beta^2)) on the shared scale."""
    s, t = student.rating, teacher.rating
    z = (s.mu - t.mu) / math.sqrt(s.sigma**2 + t.sigma**2 + 2 * beta**2)
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


class _RatedMatchmaker:
    """Shared TrueSkill update: student wins above p, teacher wins below, a draw within the margin."""

    def __init__(self, params: Any) -> None:
        import trueskill

        self.params = params
        p = params
        self.env = trueskill.TrueSkill(
            mu=getattr(p, "mu", 25.0),
            sigma=getattr(p, "sigma", 25 / 3),
            beta=getattr(p, "beta", 25 / 6),
            tau=getattr(p, "tau", 25 / 300),
            draw_probability=getattr(p, "draw_probability", 0.1),
        )
        self.beta = self.env.beta

    def expected(self, student: Any, teacher: Any) -> float:
        return expected_solve_rate(student, teacher, self.beta)

    def state_dict(self) -> dict[str, Any] | None:
        return None  # ratings live on the members; only a matchmaker with its own counters has state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def update_ratings(self, outcomes: Sequence[MatchOutcome], members: dict[str, Any]) -> None:
        """``teacher_outcome: zero_sum``: one result for both sides; ``reward``: the teacher's from
        :func:`teacher_solve_rate`, the student's from its solve rate (none without a valid problem), each side
        taking its own half of a TrueSkill game against the other's rating before the match."""
        mode = getattr(self.params, "teacher_outcome", "zero_sum")
        for o in outcomes:
            teacher, student = members[o.teacher], members[o.student]
            t = self.env.create_rating(teacher.rating.mu, teacher.rating.sigma)
            s = self.env.create_rating(student.rating.mu, student.rating.sigma)
            new_s, new_t = self._game(s, t, teacher_solve_rate(o, mode), o.expected_solve_rate)
            if mode == "reward":
                new_s = self._game(s, t, o.solve_rate, o.expected_solve_rate)[0] if o.solve_rate is not None else s
            teacher.rating.mu, teacher.rating.sigma = new_t.mu, new_t.sigma
            student.rating.mu, student.rating.sigma = new_s.mu, new_s.sigma

    def _game(self, s: Any, t: Any, rate: float, expected: float) -> tuple[Any, Any]:
        """(student, teacher) after one game: the student wins above ``expected``, loses below, a draw within
        the margin."""
        margin = getattr(self.params, "draw_margin", 0.0)
        if abs(rate - expected) <= margin and (margin > 0 or rate == expected):
            return self.env.rate_1vs1(s, t, drawn=True)
        if rate > expected:
            return self.env.rate_1vs1(s, t)
        t, s = self.env.rate_1vs1(t, s)
        return s, t


def teacher_solve_rate(outcome: MatchOutcome, mode: str) -> float:
    """The solve rate a teacher's rating is judged on: the mean over every proposal it generated, one with no
    usable problem counting as solved (so invalid proposals count in proportion); under ``reward`` a problem
    solved never or always counts as solved too, as the teacher's RL reward pays it like a failure."""
    rates = outcome.problem_rates or [outcome.solve_rate]
    if mode == "reward":
        rates = [r if r is not None and 0 < r < 1 else None for r in rates]
    return sum(1.0 if r is None else r for r in rates) / len(rates)


class PFSP(_RatedMatchmaker):
    """Prioritized fictitious self-play: each teacher draws a student weighted by p(1-p)."""

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

    def __init__(self, params: Any) -> None:
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
