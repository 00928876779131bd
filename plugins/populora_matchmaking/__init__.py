"""Matchmakers (pfsp, round_robin, random) and PBT selection schemes (truncation, tournament, tiered)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from populora_core import Params, hookimpl


class PFSPParams(Params):
    """TrueSkill PFSP: teachers and students on one zero-sum scale (PopuLoRA reference defaults)."""

    weighting: Literal["var", "hard", "uniform"] = Field(
        "var", description="var: p(1-p) (AlphaStar f_var); hard: (1-p)^k; uniform"
    )
    hard_exponent: float = Field(2.0, gt=0, description="k of the `hard` weighting")
    pairing: Literal["many_to_one", "one_to_one"] = Field(
        "many_to_one", description="[choice] one_to_one: a student is drawn at most once per step"
    )
    draw_margin: float = Field(0.0, ge=0, le=1, description="[choice] |solve rate - p| within this margin is a draw")
    mu: float = 25.0
    sigma: float = 25.0 / 3.0
    beta: float = 25.0 / 6.0
    tau: float = 25.0 / 300.0
    draw_probability: float = Field(0.1, ge=0, lt=1)


class RoundRobinParams(Params):
    """Teacher i meets student (i + step offset) mod S: everyone meets everyone in turn."""


class RandomParams(Params):
    """Each teacher draws a student uniformly at random."""


class TruncationParams(Params):
    """Replace the bottom ``fraction`` by children of the survivors, ranked by mu - k*sigma."""

    fraction: float = Field(0.25, gt=0, lt=1)
    conservative_k: float = Field(3.0, ge=0)


class TournamentParams(Params):
    """Losers of random tournaments are replaced by children of tournament winners."""

    fraction: float = Field(0.25, gt=0, lt=1)
    size: int = Field(2, ge=2)
    conservative_k: float = Field(3.0, ge=0)


class TieredParams(Params):
    """Classic PBT exploit/explore: keep the top, mutate the middle in place, replace the bottom."""

    keep: float = Field(0.3, gt=0, lt=1)
    mutate: float = Field(0.4, ge=0, lt=1)
    conservative_k: float = Field(3.0, ge=0)

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
