"""Matchmakers (pfsp, round_robin, random) and PBT selection schemes (truncation, tournament, tiered)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from populora_core.api import Params, hookimpl
from populora_core.api.population import BETA, PRIOR_MU, PRIOR_SIGMA, TAU

TEACHER_OUTCOME = (
    "[choice] what a problem its student never solved (r = 0) means for the ratings. reward: a win for neither side "
    "(it counts as the expected solve rate; only such problems: a draw), as the teacher's RL reward pays -0.5 for it "
    "and the student failed it; zero_sum: the paper's rule, a teacher win (the student's solve rate 0 is below "
    "any expectation). In both one zero-sum game per match, and each invalid proposal counts as a problem the "
    "student solved (a teacher loss in proportion)"
)


CONSERVATIVE_K = (
    "rank by mu - k*sigma. 0 (default): by mu, as a member is judged only once ready (evolution.ready_after: its "
    "own matches behind it); k > 0 ranks the less certain, younger members last whatever they do "
    "(`python -m benchmarks.research.selection` shows by how much)"
)


class RatedParams(Params):
    """What every rated matchmaker shares: the win rule of a match and TrueSkill's environment."""

    teacher_outcome: Literal["reward", "zero_sum"] = Field("reward", description=TEACHER_OUTCOME)
    draw_margin: float = Field(0.0, ge=0, le=1, description="[choice] |solve rate - p| within this margin is a draw")
    mu: float = Field(PRIOR_MU, description="the prior's mean: every member's first rating, and a fresh child's")
    sigma: float = Field(
        PRIOR_SIGMA, gt=0, description="the prior's spread: every member's first rating, and the cap of a child's"
    )
    beta: float = Field(BETA, gt=0, description="one performance spread (TrueSkill's beta)")
    tau: float = Field(TAU, ge=0, description="the spread added to a rating before each match (TrueSkill's tau)")
    draw_probability: float = Field(
        0.1, ge=0, lt=1, description="the share of games TrueSkill expects drawn (sets its own draw margin)"
    )


class PFSPParams(RatedParams):
    """TrueSkill PFSP: teachers and students on one scale (PopuLoRA reference defaults)."""

    weighting: Literal["var", "hard", "uniform"] = Field(
        "var", description="var: p(1-p) (AlphaStar f_var); hard: (1-p)^k; uniform"
    )
    hard_exponent: float = Field(2.0, gt=0, description="k of the `hard` weighting")
    pairing: Literal["many_to_one", "one_to_one"] = Field(
        "one_to_one",
        description="[choice] one_to_one: teachers (in a random order) draw students without replacement, a new "
        "round once every student is drawn, so no student idles when teachers >= students; many_to_one: each "
        "teacher draws on its own (two may draw the same student and leave another idle)",
    )


class RoundRobinParams(RatedParams):
    """Teacher i meets student (i + step offset) mod S: everyone meets everyone in turn."""


class RandomParams(RatedParams):
    """Teachers draw students uniformly at random without replacement (a new round once every student is drawn)."""


class TruncationParams(Params):
    """Replace the bottom ``fraction`` by children of the survivors, ranked by mu - k*sigma."""

    fraction: float = Field(0.25, gt=0, lt=1)
    conservative_k: float = Field(0.0, ge=0, description=CONSERVATIVE_K)


class TournamentParams(Params):
    """Losers of random tournaments are replaced by children of tournament winners."""

    fraction: float = Field(0.25, gt=0, lt=1)
    size: int = Field(2, ge=2)
    conservative_k: float = Field(0.0, ge=0, description=CONSERVATIVE_K)


class TieredParams(Params):
    """Classic PBT exploit/explore: keep the top, mutate the middle in place, replace the bottom."""

    keep: float = Field(0.3, gt=0, lt=1)
    mutate: float = Field(0.4, ge=0, lt=1)
    conservative_k: float = Field(0.0, ge=0, description=CONSERVATIVE_K)

    @model_validator(mode="after")
    def _fractions(self) -> TieredParams:
        if self.keep + self.mutate > 1:
            raise ValueError("keep + mutate must be at most 1 (the rest is replaced)")
        return self


@hookimpl
def register_matchmakers(register):
    from .matchmakers import PFSP, RandomMatchmaker, RoundRobin

    register("pfsp", PFSP, params=PFSPParams)
    register("round_robin", RoundRobin, params=RoundRobinParams)
    register("random", RandomMatchmaker, params=RandomParams)


@hookimpl
def register_selectors(register):
    from .selectors import Tiered, Tournament, Truncation

    register("truncation", Truncation, params=TruncationParams)
    register("tournament", Tournament, params=TournamentParams)
    register("tiered", Tiered, params=TieredParams)
