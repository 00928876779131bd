"""What runs inside one Ray worker actor: the recipe's engine and/or trainer on this worker's copy of the base.

The class is plain Python (``ray.remote`` is applied by the cluster at start-up, so importing this module
needs no Ray). Components are built from the worker's own plugin registry by name (the driver's ``--plugin``
files are loaded here first), with the context the driver would have handed their factories, and share the
worker's one base model (populora_core.services.modelhost), as the engine and trainer of a single process do. Every
method returns its result with the seconds it spent inside, so the driver can tell Ray's overhead from the work.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from populora_core.api.components import AdapterRef, GenerationRequest, SamplingParams, UpdateJob
from populora_core.services.gpu import visible_gpu_bytes

from . import transfer

#: Trainer methods the driver may call on a worker's trainer (the MemberStateTrainer contract).
TRAINER_CALLS = frozenset({"copy_state", "forget", "export_member", "import_member", "save_members", "load_members"})
#: Those of them whose first argument is a run-directory path (a checkpoint's trainer folder).
TRAINER_CALLS_ON_A_DIRECTORY = frozenset({"save_members", "load_members"})


class PopulationWorker:
    """One worker: a role (``colocated``, ``engine`` or ``trainer``) and the components it was asked to build."""

    def __init__(self, index: int, role: str, threads: int) -> None:
        self.index, self.role, self.threads = index, role, threads
        self.engine: Any = None
        self.trainer: Any = None
        self.mirror: Path | None = None  # transfer: object_store; None: the run directory is shared

    def describe(self) -> dict[str, Any]:
        """Where this worker runs: what placement tests and error messages name."""
        import ray

        return {
            "index": self.index,
            "role": self.role,
            "pid": os.getpid(),
            "node": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "gpu_bytes": visible_gpu_bytes() if ray.get_gpu_ids() else 0,
        }

    def sees(self, path: str, token: str) -> bool:
        """True when ``path`` exists here with ``token`` in it: the run directory is shared with the driver."""
        try:
            return Path(path).read_text() == token
        except OSError:
            return False

    def load_plugin_files(self, files: list[str]) -> None:
        """Load the driver's ``--plugin`` files here too; one this worker cannot read is an error naming it."""
        from populora_core.api import UserError, get_registry

        for file in files:
            if not Path(file).is_file():
                raise UserError(
                    f"--plugin {file}: ray worker {self.index} (pid {os.getpid()}) cannot see this file; plugin "
                    "files must be on a filesystem every Ray node mounts at the same path, as the run directory is"
                )
        get_registry(files)  # into this process's registry, which build() reads

    def build(self, kind: str, name: str, params: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        """Build the recipe's engine or trainer here; returns what the driver needs to know about it."""
        from populora_core.api import get_registry
        from populora_core.services.runtime import set_torch_threads

        set_torch_threads(self.threads)  # Ray sets OMP_NUM_THREADS from the actor's CPUs; results depend on it

        component = get_registry().get(kind, name)
        built = component.build(params, **context)
        if kind == "engine":
            self.engine = built
            return {
                "row_seeded": bool(getattr(built, "row_seeded", False)),
                "served_dtype": getattr(built, "served_dtype", None),
            }
        self.trainer = built
        from populora_core.api.components import MemberStateTrainer

        return {
            "needs_sampling_logprobs": bool(built.needs_sampling_logprobs),
            "algorithm": str(getattr(built, "algorithm", "") or name),
            "member_states": isinstance(built, MemberStateTrainer),
            "plugin": component.plugin,
        }

    # --- run-directory files through the object store (transfer: object_store) ------------------------

    def use_mirror(self) -> str:
        """Keep the driver's run-directory files in a private mirror from now on; returns its path."""
        self.mirror = Path(tempfile.mkdtemp(prefix=f"populora-ray-worker{self.index}-"))
        return str(self.mirror)

    def receive(self, gone: Sequence[str], *bundles: transfer.Bundle) -> tuple[None, float]:
        """Mirrored paths the driver deleted, and the files it shipped (Ray fetched them from the object store
        before the call). All transfer, so no time inside is counted."""
        assert self.mirror is not None, "receive needs use_mirror first"
        for bundle in bundles:
            transfer.unpack(bundle, self.mirror)
        transfer.remove(gone, self.mirror)
        return None, 0.0

    def send(self, paths: Sequence[str]) -> tuple[dict[str, Any], float]:
        """The mirrored files at these driver paths, one object in the store per unit (transfer.units): the driver
        writes them into the run directory and hands the same objects to the other workers that read them."""
        import ray

        return {unit: ray.put(transfer.pack([unit], self.mirror)) for unit in transfer.units(paths, self.mirror)}, 0.0

    def _here(self, ref: AdapterRef | None) -> AdapterRef | None:
        if ref is None or self.mirror is None:
            return ref
        return dataclasses.replace(ref, path=str(transfer.mirrored(self.mirror, ref.path)))

    # --- the components' calls --------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> tuple[Any, float]:
        start = time.perf_counter()
        requests = [dataclasses.replace(r, adapter=self._here(r.adapter)) for r in requests]
        return self.engine.generate(requests, sampling), time.perf_counter() - start

    def sleep(self) -> tuple[None, float]:
        start = time.perf_counter()
        self.engine.sleep()
        return None, time.perf_counter() - start

    def update_many(self, jobs: Sequence[UpdateJob]) -> tuple[list[Any], float]:
        """This worker's members' updates, one after another, in the order given."""
        start = time.perf_counter()
        stats = []
        for job in jobs:
            out_dir = transfer.mirrored(self.mirror, job.out_dir)
            if self.mirror is not None:
                out_dir.parent.mkdir(parents=True, exist_ok=True)
            stats.append(self.trainer.update(job.member_id, self._here(job.adapter), job.rollouts, out_dir))
        return stats, time.perf_counter() - start

    def trainer_call(self, method: str, *args: Any) -> tuple[Any, float]:
        if method not in TRAINER_CALLS:
            raise ValueError(f"not a trainer call a worker takes: {method!r}")
        if method in TRAINER_CALLS_ON_A_DIRECTORY:
            args = (str(transfer.mirrored(self.mirror, args[0])), *args[1:])
        start = time.perf_counter()
        return getattr(self.trainer, method)(*args), time.perf_counter() - start

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self.mirror is not None:
            shutil.rmtree(self.mirror, ignore_errors=True)
