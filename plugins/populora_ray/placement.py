"""Which trainer worker owns which member: balanced, deterministic, and moving as few members as it can.

Where a member trains never changes what it computes (each update depends only on the member's adapter,
rollouts and optimizer state), so placement is free to follow load. Rules: a new member goes to the
least-loaded worker (lowest index on ties; a child bred after the member it replaces left finds that
member's worker emptiest); before each step's updates, while two workers differ by more than one member,
the most recently placed member of the fullest worker moves to the emptiest (a newcomer moves, not a
long-lived member).
"""

from __future__ import annotations

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

    def rebalance(self) -> list[Move]:
        """Moves that bring every worker within one member of every other (applied to the placement)."""
        moves = []
        while True:
            loads = self.loads()
            source, target = loads.index(max(loads)), loads.index(min(loads))
            if loads[source] - loads[target] <= 1:
                return moves
            member = next(m for m in reversed(self._order) if self.owner[m] == source)
            self.assign(member, target)
            moves.append(Move(member, source, target))
