"""The driver's trainer on a Ray cluster: members owned by trainer workers, every worker training at once.

Each worker runs the recipe's trainer on its own copy of the base for the members it owns
(:mod:`.placement`), balanced step by step by the tokens each member trains on. A child takes the place of
the member it replaces, on that member's worker; when it inherits its parent's optimizer state
(``evolution.child_optimizer: inherit``) from another worker, the moments move through the object store
(``export_member`` -> ``import_member``). A member that moves to balance a step's work takes its state along
the same way. Checkpoints: every worker writes its own members' files into the checkpoint folder on the
shared run directory (``transfer: object_store``: into its mirror, and the driver fetches them), then the
driver writes the manifest (populora_core.services.trainer_state), so a checkpoint loads on any number of workers, or
in a single process.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from populora_core.api.components import AdapterRef, Rollout, Trainer, UpdateJob, UpdateStats
from populora_core.services.trainer_state import read_manifest, write_manifest

from .placement import MemberPlacement
from .transfer import absolute

#: what a member's update costs beyond its tokens, in tokens (loading its slot, the optimizer step, writing
#: its adapter): about 0.3 s against 0.4 ms a token on nano (measured per update, 4T-4S)
UPDATE_OVERHEAD_TOKENS = 700


def work(job: UpdateJob) -> float:
    """An update's cost for balancing: the tokens it trains on plus a member's fixed cost."""
    return UPDATE_OVERHEAD_TOKENS + sum(len(r.prompt_token_ids) + len(r.completion_token_ids) for r in job.rollouts)


class RayTrainer(Trainer):
    def __init__(self, cluster: Any, workers: list[Any], *, algorithm: str, needs_logprobs: bool) -> None:
        self.cluster = cluster
        self.workers = workers
        self.algorithm = algorithm
        self._needs_logprobs = needs_logprobs
        self.placement = MemberPlacement(len(workers))
        self._pending: dict[str, str] = {}  # child -> parent whose optimizer state it inherits (copy_state)
        #: optimizer states moved between workers: "inherit" (a child bred away from its parent), "balance"
        self.state_moves: Counter[str] = Counter()

    @property
    def needs_sampling_logprobs(self) -> bool:
        return self._needs_logprobs

    def _call(self, what: str, worker_index: int, method: str, *args: Any) -> Any:
        worker = self.workers[worker_index]
        return self.cluster.call(what, [(worker, worker.actor.trainer_call.remote(method, *args))])[0]

    def _on_all(self, what: str, method: str, args_of: Any) -> list[Any]:
        calls = [(w, w.actor.trainer_call.remote(method, *args_of(i))) for i, w in enumerate(self.workers)]
        return self.cluster.call(what, calls)

    # --- updates ------------------------------------------------------------------------------------

    def update(self, member_id: str, adapter: AdapterRef, rollouts: Sequence[Rollout], out_dir: Path) -> UpdateStats:
        return self.update_many([UpdateJob(member_id, adapter, rollouts, out_dir)])[0]

    def update_many(self, jobs: Sequence[UpdateJob]) -> list[UpdateStats]:
        """Place new members, balance this step's work (moving state with a member), then every worker trains
        its own at once."""
        self._settle()
        jobs = [dataclasses.replace(j, adapter=absolute(j.adapter), out_dir=Path(j.out_dir).absolute()) for j in jobs]
        # the versions this step supersedes leave the object store: every engine reads the new ones from now on
        self.cluster.release(j.adapter.path for j in jobs)
        for move in self.placement.balance({job.member_id: work(job) for job in jobs}):
            self.state_moves["balance"] += 1
            state = self._call("move", move.source, "export_member", move.member)
            self._call("move", move.target, "import_member", move.member, state)
            self._call("move", move.source, "forget", move.member)
        by_worker: dict[int, list[int]] = {}
        for i, job in enumerate(jobs):
            by_worker.setdefault(self.placement.owner[job.member_id], []).append(i)
        self.cluster.ship([(self.workers[w], [jobs[i].adapter.path for i in idx]) for w, idx in by_worker.items()])
        calls = [
            (self.workers[w], self.workers[w].actor.update_many.remote([jobs[i] for i in idx]))
            for w, idx in sorted(by_worker.items())
        ]
        results: list[UpdateStats | None] = [None] * len(jobs)
        for (_, idx), stats in zip(sorted(by_worker.items()), self.cluster.call("train", calls)):
            for i, s in zip(idx, stats):
                results[i] = s
        wrote = [(self.workers[w], [str(jobs[i].out_dir) for i in idx]) for w, idx in sorted(by_worker.items())]
        self.cluster.fetch(wrote, share=True)
        return [s for s in results if s is not None]

    # --- member state -------------------------------------------------------------------------------

    def copy_state(self, source_member: str, target_member: str) -> None:
        """Recorded now, done at the next call: the loop forgets the dead member right after, so the child can
        then take the dead member's worker (the least loaded), its parent's moments moved there if need be."""
        self._settle(source_member, target_member)
        self.forget(target_member)
        self._pending[target_member] = source_member

    def forget(self, member_id: str) -> None:
        self._settle(member_id)  # a copy that reads this member's state happens before it goes
        self._pending.pop(member_id, None)
        worker = self.placement.owner.get(member_id)
        if worker is not None:
            self._call("forget", worker, "forget", member_id)
            self.placement.drop(member_id)
        self._settle()  # a child waiting for the member it replaces to leave takes that worker now

    def _settle(self, *involved: str) -> None:
        """Carry out pending copies: all of them, or (with ``involved``) those whose source or target is named
        (a copy must read its source before anything changes or forgets it)."""
        for target, source in list(self._pending.items()):
            if involved and source not in involved and target not in involved:
                continue
            del self._pending[target]
            owner = self.placement.owner.get(source)
            if owner is None:  # a source without state: the child starts fresh
                continue
            worker = self.placement.place(target)
            if worker == owner:
                self._call("inherit", worker, "copy_state", source, target)
            else:
                self.state_moves["inherit"] += 1
                state = self._call("inherit", owner, "export_member", source)
                self._call("inherit", worker, "import_member", target, state)

    def members(self) -> list[str]:
        self._settle()
        return sorted(self.placement.owner)

    def save_state(self, directory: Path) -> None:
        """Each worker writes its members' files; the manifest, written last, makes the folder complete."""
        self._settle()
        directory = Path(directory).absolute()
        directory.mkdir(parents=True, exist_ok=True)
        parts = self._on_all("checkpoint", "save_members", lambda i: (str(directory), self.placement.members_of(i)))
        self.cluster.fetch(
            [(w, [str(directory / rel) for rel in part.values()]) for w, part in zip(self.workers, parts)]
        )
        files = {member: rel for part in parts for member, rel in part.items()}
        write_manifest(directory, self.algorithm, files)

    def load_state(self, directory: Path) -> None:
        """Members placed afresh over this cluster's workers, each loading only its own (any saved worker count)."""
        self._pending.clear()
        directory = Path(directory).absolute()
        for member in self.members():
            self.forget(member)
        manifest = read_manifest(Path(directory), self.algorithm)
        files = manifest["members"]
        for member in sorted(files):
            self.placement.place(member)
        mine = [
            (w, [str(directory / files[m]) for m in self.placement.members_of(i)]) for i, w in enumerate(self.workers)
        ]
        self.cluster.ship(mine, again=True)
        self._on_all(
            "resume",
            "load_members",
            lambda i: (str(directory), {m: files[m] for m in self.placement.members_of(i)}),
        )
