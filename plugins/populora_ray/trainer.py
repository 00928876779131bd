"""The driver's trainer on a Ray cluster: members owned by trainer workers, every worker training at once.

Each worker runs the recipe's trainer on its own copy of the base for the members it owns
(:mod:`.placement`). A member that moves (a new balance after evolution) takes its optimizer state along
through the object store (``export_member`` -> ``import_member``), so a child bred from a parent on another
worker still starts from its parent's moments. Checkpoints: every worker writes its own members' files into
the checkpoint folder on the shared run directory, then the driver writes the manifest
(populora_core.trainer_state), so a checkpoint loads on any number of workers, or in a single process.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from populora_core.components import AdapterRef, Rollout, UpdateJob, UpdateStats
from populora_core.trainer_state import read_manifest, write_manifest

from .placement import MemberPlacement


class RayTrainer:
    def __init__(self, cluster: Any, workers: list[Any], *, algorithm: str, needs_logprobs: bool) -> None:
        self.cluster = cluster
        self.workers = workers
        self.algorithm = algorithm
        self.needs_sampling_logprobs = needs_logprobs
        self.placement = MemberPlacement(len(workers))

    def _call(self, what: str, worker_index: int, method: str, *args: Any) -> Any:
        worker = self.workers[worker_index]
        return self.cluster.call(what, [(worker, worker.actor.trainer_call.remote(method, *args))])[0]

    def _on_all(self, what: str, method: str, args_of: Any) -> list[Any]:
        calls = [(w, w.actor.trainer_call.remote(method, *args_of(i))) for i, w in enumerate(self.workers)]
        return self.cluster.call(what, calls)

    # --- updates ------------------------------------------------------------------------------------

    def update(self, member_id: str, adapter: AdapterRef, rollouts: Sequence[Rollout], out_dir: Path) -> UpdateStats:
        return self.update_many([UpdateJob(member_id, adapter, rollouts, out_dir)])[0]

    def update_many(self, jobs: list[UpdateJob]) -> list[UpdateStats]:
        """Place new members, rebalance (moving state with a member), then every worker trains its own at once."""
        for job in jobs:
            self.placement.place(job.member_id)
        for move in self.placement.rebalance():
            state = self._call("move", move.source, "export_member", move.member)
            self._call("move", move.target, "import_member", move.member, state)
            self._call("move", move.source, "forget", move.member)
        by_worker: dict[int, list[int]] = {}
        for i, job in enumerate(jobs):
            by_worker.setdefault(self.placement.owner[job.member_id], []).append(i)
        calls = [
            (self.workers[w], self.workers[w].actor.update_many.remote([jobs[i] for i in idx]))
            for w, idx in sorted(by_worker.items())
        ]
        results: list[UpdateStats | None] = [None] * len(jobs)
        for (w, idx), stats in zip(sorted(by_worker.items()), self.cluster.call("train", calls)):
            for i, s in zip(idx, stats):
                results[i] = s
        return [s for s in results if s is not None]

    # --- member state -------------------------------------------------------------------------------

    def copy_state(self, source_member: str, target_member: str) -> None:
        """The child inherits on its parent's worker; a later rebalance may move it, moments and all."""
        if source_member not in self.placement.owner:
            self.forget(target_member)
            return
        worker = self.placement.owner[source_member]
        current = self.placement.owner.get(target_member)
        if current is not None and current != worker:
            self._call("copy_state", current, "forget", target_member)
        self._call("copy_state", worker, "copy_state", source_member, target_member)
        self.placement.assign(target_member, worker)

    def forget(self, member_id: str) -> None:
        worker = self.placement.owner.get(member_id)
        if worker is not None:
            self._call("forget", worker, "forget", member_id)
            self.placement.drop(member_id)

    def members(self) -> list[str]:
        return sorted(self.placement.owner)

    def save_state(self, directory: Path) -> None:
        """Each worker writes its members' files; the manifest, written last, makes the folder complete."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        parts = self._on_all(
            "checkpoint", "save_members", lambda i: (str(directory), self.placement.members_of(i))
        )
        files = {member: rel for part in parts for member, rel in part.items()}
        write_manifest(directory, self.algorithm, files)

    def load_state(self, directory: Path) -> None:
        """Members placed afresh over this cluster's workers, each loading only its own (any saved worker count)."""
        for member in self.members():
            self.forget(member)
        manifest = read_manifest(Path(directory), self.algorithm)
        if manifest is None:  # one file for every member (saved before manifests): each worker keeps its own
            self._on_all("resume", "load_state", lambda i: (str(directory),))
            loaded = self._on_all("resume", "members", lambda i: ())
            for member in loaded[0]:
                self.placement.place(member)
            for i, held in enumerate(loaded):
                for member in held:
                    if self.placement.owner[member] != i:
                        self._call("resume", i, "forget", member)
            return
        files = manifest["members"]
        for member in sorted(files):
            self.placement.place(member)
        self._on_all(
            "resume",
            "load_members",
            lambda i: (str(directory), {m: files[m] for m in self.placement.members_of(i)}),
        )
