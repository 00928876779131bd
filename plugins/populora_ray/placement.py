"""Which trainer worker owns which member: balanced by this step's work, deterministic, few moves.

Where a member trains never changes what it computes (each update depends only on the member's adapter,
rollouts and optimizer state), so placement is free to follow load. A new member goes to the worker with
the fewest members (lowest index on ties; a child bred after the member it replaces left finds that
member's worker emptiest). Before each step's updates, :meth:`MemberPlacement.balance` moves members from
the busiest worker to the idlest while a move shortens the busiest one's work: the workers train at once,
so the step waits for the busiest, and members' work differs a lot (a student matched with many problems
trains on several times the tokens of one matched with few).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Move:
    member: str
    source: int
    target: int


class MemberPlacement:
    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError("a placement needs at least one worker")
        self.workers = workers
        self.owner: dict[str, int] = {}
        self._order: list[str] = []  # placement recency, oldest first

    def loads(self) -> list[int]:
        counts = [0] * self.workers
        for worker in self.owner.values():
            counts[worker] += 1
        return counts

    def members_of(self, worker: int) -> list[str]:
        return sorted(m for m, w in self.owner.items() if w == worker)

    def assign(self, member: str, worker: int) -> None:
        self.drop(member)
        self.owner[member] = worker
        self._order.append(member)

    def place(self, member: str) -> int:
        """The member's worker; a member seen for the first time goes to the least-loaded one."""
        if member not in self.owner:
            loads = self.loads()
            self.assign(member, loads.index(min(loads)))
        return self.owner[member]

    def drop(self, member: str) -> None:
        if self.owner.pop(member, None) is not None:
            self._order.remove(member)

    def balance(self, costs: Mapping[str, float], min_gain: float = 0.05) -> list[Move]:
        """Moves (applied) that lower the most any worker must do, given each member's cost this step.

        Members without a cost do no work this step. Greedy: move the member of the busiest worker that best
        evens it with the idlest, while that shortens the busiest worker's work by at least ``min_gain`` of
        the mean work per worker (a move carries the member's optimizer state, so a marginal one is not made).
        """
        moves: list[Move] = []
        mean = sum(costs.values()) / self.workers
        for _ in range(len(costs)):
            loads = [0.0] * self.workers
            for member, cost in costs.items():
                loads[self.place(member)] += cost
            source, target = loads.index(max(loads)), loads.index(min(loads))
            movable = sorted(m for m in costs if self.owner[m] == source)
            if not movable:
                break
            best = min(movable, key=lambda m: (max(loads[source] - costs[m], loads[target] + costs[m]), m))
            after = max(loads[source] - costs[best], loads[target] + costs[best])
            if loads[source] - after < min_gain * mean:
                break
            self.assign(best, target)
            moves.append(Move(best, source, target))
        return moves
