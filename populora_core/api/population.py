"""Population model: members with roles, immutable adapter versions, lineage, ratings and counters.

Plain data (no torch) so it serialises to JSON inside checkpoints and the run directory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ROLES = ("teacher", "student", "both")

#: TrueSkill's prior, stated once: a new member's rating (``Rating()``) unless its matchmaker sets another
#: (:meth:`populora_core.api.components.Matchmaker.prior`: pfsp's ``mu`` and ``sigma``), and the scale's
#: performance spread ``BETA`` and dynamics ``TAU``, TrueSkill's defaults for that mu.
PRIOR_MU = 25.0
PRIOR_SIGMA = PRIOR_MU / 3.0
BETA = PRIOR_MU / 6.0
TAU = PRIOR_MU / 300.0


@dataclass
class Lineage:
    """How a member's first version came to be: ``operator`` over ``parents`` (version names)."""

    parents: list[str] = field(default_factory=list)
    operator: str = "init"
    params: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    step: int = 0


@dataclass
class Rating:
    mu: float = PRIOR_MU
    sigma: float = PRIOR_SIGMA

    def conservative(self, k: float = 3.0) -> float:
        return self.mu - k * self.sigma


@dataclass
class Counters:
    """Compute spent on a member: what a compute-matched comparison checks after the fact."""

    rollouts: int = 0  # trained rollouts
    estimation_rollouts: int = 0  # solver samples used only to estimate learnability
    tokens: int = 0  # generated tokens (trained + estimation)
    trained_tokens: int = 0
    updates: int = 0
    matches: int = 0  # rated matches played: what readiness (evolution.ready_after) counts


@dataclass
class Member:
    id: str
    role: str
    version: int = 0
    lineage: Lineage = field(default_factory=Lineage)
    rating: Rating = field(default_factory=Rating)
    counters: Counters = field(default_factory=Counters)
    born_step: int = 0

    def __post_init__(self) -> None:
        from .names import MEMBER_ID, check_name

        check_name(self.id, MEMBER_ID, "member id")  # it names folders and files of the run directory
        if self.role not in ROLES:
            raise ValueError(f"member {self.id}: role must be one of {ROLES}, not {self.role!r}")

    @property
    def version_name(self) -> str:
        """Immutable name of the current adapter version, e.g. ``s1@v4``."""
        return f"{self.id}@v{self.version}"

    @property
    def teaches(self) -> bool:
        return self.role in ("teacher", "both")

    @property
    def solves(self) -> bool:
        return self.role in ("student", "both")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Member:
        return cls(
            id=d["id"],
            role=d["role"],
            version=d["version"],
            lineage=Lineage(**d["lineage"]),
            rating=Rating(**d["rating"]),
            counters=Counters(**d["counters"]),
            born_step=d.get("born_step", 0),
        )


@dataclass
class Population:
    members: dict[str, Member] = field(default_factory=dict)
    next_index: dict[str, int] = field(default_factory=dict)  # per-prefix id counter for children

    @classmethod
    def create(cls, teachers: int, students: int, *, shared: bool = False, prior: Rating | None = None) -> Population:
        """``shared``: one adapter per slot playing both roles (the single-agent baseline); ``prior``: every
        member's first rating (each its own copy; None: TrueSkill's, ``Rating()``)."""
        pop, first = cls(), prior or Rating()
        if shared:
            slots = [("a", "both")] * max(teachers, students)
        else:
            slots = [("t", "teacher")] * teachers + [("s", "student")] * students
        for prefix, role in slots:
            pop.add_new(prefix, role, rating=Rating(first.mu, first.sigma))
        return pop

    def add_new(self, prefix: str, role: str, **kwargs: Any) -> Member:
        index = self.next_index.get(prefix, 0)
        self.next_index[prefix] = index + 1
        member = Member(id=f"{prefix}{index}", role=role, **kwargs)
        self.members[member.id] = member
        return member

    def remove(self, member_id: str) -> Member:
        return self.members.pop(member_id)

    @property
    def teachers(self) -> list[Member]:
        return [m for m in self.members.values() if m.teaches]

    @property
    def students(self) -> list[Member]:
        return [m for m in self.members.values() if m.solves]

    def subpopulations(self) -> dict[str, list[Member]]:
        """Members grouped by role: selection and replacement happen within a group."""
        groups: dict[str, list[Member]] = {}
        for m in self.members.values():
            groups.setdefault(m.role, []).append(m)
        return groups

    def to_dict(self) -> dict[str, Any]:
        return {"members": [m.to_dict() for m in self.members.values()], "next_index": dict(self.next_index)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Population:
        members = {m["id"]: Member.from_dict(m) for m in d["members"]}
        return cls(members, dict(d["next_index"]))
