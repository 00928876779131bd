"""The averages the eval table shows beside the benchmarks: groups of benchmarks this plugin defines (AZR's CAvg
and MAvg), read by the table, its footer and the results' ``averages_of``. An evaluator's ``category`` says what
its answers are; which average a score enters is the group's, named here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Group:
    """A column averaging benchmarks: its header and members; a stand-in counts when only it ran (HE for HE+)."""

    header: str
    members: tuple[str, ...]
    stand_ins: Mapping[str, str] = field(default_factory=dict)

    def scored(self, names: Iterable[str]) -> list[str]:
        """The benchmarks of ``names`` this group averages, in the group's order (a stand-in for a member not there)."""
        there = set(names)
        return [
            name if name in there else self.stand_ins[name]
            for name in self.members
            if name in there or self.stand_ins.get(name) in there
        ]


#: AZR's averages, by column: CAvg over its 3 code benchmarks (HumanEval and MBPP standing in for their plus versions
#: when only they ran), MAvg over its 6 math ones (GSM8K is in neither); AVG is the mean of the groups with a score.
GROUPS = {
    "code_avg": Group(
        "CAvg", ("humaneval_plus", "mbpp_plus", "livecodebench"), {"humaneval_plus": "humaneval", "mbpp_plus": "mbpp"}
    ),
    "math_avg": Group("MAvg", ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")),
}


def averages(bench_scores: Mapping[str, float | None]) -> dict[str, float | None]:
    """Each group's mean over its benchmarks that have a score, and AVG, the mean of the groups that have one."""
    scored = {name: value for name, value in bench_scores.items() if value is not None}
    out: dict[str, float | None] = {}
    for column, group in GROUPS.items():
        values = [scored[name] for name in group.scored(scored)]
        out[column] = sum(values) / len(values) if values else None
    means = [v for v in out.values() if v is not None]
    out["overall"] = sum(means) / len(means) if means else None
    return out


def average_columns() -> list[str]:
    """The table's average columns: the groups', then AVG."""
    return [*GROUPS, "overall"]


def average_members(benches: Iterable[str]) -> dict[str, list[str]]:
    """Which of ``benches`` each group averages."""
    benches = list(benches)
    return {column: group.scored(benches) for column, group in GROUPS.items()}


def footer(averages_of: Mapping[str, list[str]]) -> str:
    """How the average columns were made, from the results' ``averages_of``: the table's foot sentence."""
    made = [f"{g.header} = mean of {', '.join(averages_of.get(c, [])) or 'none'}" for c, g in GROUPS.items()]
    headers = [g.header for g in GROUPS.values()]
    return "; ".join([*made, f"AVG = ({' + '.join(headers)}) / {len(headers)} (AZR)."])
