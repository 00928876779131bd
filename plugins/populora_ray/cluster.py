"""The ``ray`` cluster: worker actors in one placement group, each hosting the base once.

Started (or joined) once per run, before the engine and the trainer, which it then builds on its workers.
Layouts: ``colocated`` (every worker runs an engine and a trainer on one copy of the base, verl's hybrid
shape) and ``disaggregated`` (engine workers serve every adapter; trainer workers own members). The run
directory is the exchange: adapters are immutable PEFT directories in it and checkpoints are written into
it by the workers that own the state, so it must be on a filesystem every node shares (checked at start),
unless ``transfer: object_store`` moves those files through Ray's object store (transfer.py).
Everything Ray-specific is imported inside functions: loading the plugin needs no Ray.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from populora_core.api.components import Cluster
from populora_core.api.errors import PopuloraError, UserError

from . import transfer
from .worker import PopulationWorker


class WorkerLost(UserError):
    """A worker died (killed, out of memory, node lost): the run stops; ``populora resume`` continues it."""

    exit_code = 1  # a failure of the machine, not bad input


@dataclass
class Worker:
    index: int
    role: str  # colocated | engine | trainer
    actor: Any
    info: dict[str, Any] = field(default_factory=dict)

    def where(self) -> str:
        info = self.info
        return f"ray worker {self.index} ({self.role}, pid {info.get('pid', '?')} on {info.get('node', '?')})"


@dataclass
class RemoteTime:
    """Seconds of every remote call: wall time seen by the driver and the slowest worker's time inside."""

    wall_s: float = 0.0
    inside_s: float = 0.0
    calls: int = 0

    @property
    def overhead_s(self) -> float:
        """Serialization, scheduling and transfer: what the driver waited beyond the slowest worker's work."""
        return max(0.0, self.wall_s - self.inside_s)


def import_ray(setting: str = "cluster.name: ray") -> Any:
    try:
        import ray
    except ImportError:
        raise UserError(
            f"{setting} needs the ray package, which is not installed "
            "(pip install 'populora-toolkit[ray]', or pip install ray==2.60.0)"
        ) from None
    return ray


def connect(
    ray: Any,
    address: str,
    connect_timeout_s: float,
    *,
    local_cpus: int | None = None,
    local_gpus: int | None = None,
    setting: str = "cluster.params.address",
) -> bool:
    """Join ``address`` (or the Ray this process already joined, or ``$RAY_ADDRESS``), else start a local cluster.

    An empty address never joins a cluster Ray finds on its own (the newest ``ray start`` on this machine, which
    is how Ray reads ``address=None``): a run that asked for a local cluster gets its own, sized as asked.
    ``$RAY_ADDRESS`` is honoured as Ray's jobs set it. Returns whether this call started Ray (whoever did shuts it
    down). ``setting`` names the address key.
    """
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": "warning", "log_to_driver": True}
    target = address or os.environ.get("RAY_ADDRESS", "")
    sizing = setting.rpartition(".")[0] + ".local_cpus / local_gpus"
    named = setting if address else "RAY_ADDRESS" if target else sizing  # whoever chose where Ray runs
    if target and not address and (local_cpus is not None or local_gpus is not None):
        raise UserError(f"{sizing} size a local cluster, but RAY_ADDRESS={target!r} names one to join: drop one")
    if target:
        check_reachable(target, connect_timeout_s, named)
        kwargs["address"] = target
    else:
        kwargs.update(address="local", num_cpus=local_cpus, num_gpus=local_gpus)
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        where = f"at {target!r}" if target else "on this machine"
        raise UserError(f"{named}: cannot start or reach a Ray cluster {where}: {first_line(exc)}") from None
    return True


class RayCluster(Cluster):
    """Components on Ray workers, the run in the driver. ``close`` releases every actor and the placement group."""

    def __init__(
        self, params: Any, *, run_dir: str | os.PathLike[str], plugin_files: tuple[str, ...] | list[str] = ()
    ) -> None:
        self.params = params
        self.run_dir = Path(run_dir).absolute()  # workers do not share the driver's working directory
        self.plugin_files = [str(Path(f).absolute()) for f in plugin_files]
        self.ray = import_ray()
        self.time = RemoteTime()
        self.workers: list[Worker] = []
        self._placement_group: Any = None
        self._closed = False
        # transfer: object_store: the driver paths (transfer.units) each worker's mirror holds; the units in the
        # object store for workers still to read them (ref, bytes); bytes put there by the driver, shipped to
        # workers (one delivery each) and fetched from them
        self.mirrored: dict[int, set[str]] = {}
        self.stored: dict[str, tuple[Any, int]] = {}
        self.transfer_bytes: Counter[str] = Counter()
        self._started_ray = connect(
            self.ray,
            params.address,
            params.connect_timeout_s,
            local_cpus=params.local_cpus,
            local_gpus=params.local_gpus,
        )
        try:
            self._check_resources()
            self._start_workers()
            if params.transfer == "object_store":
                mirrors = self.call("start", [(w, w.actor.use_mirror.remote()) for w in self.workers], timed=False)
                for worker, mirror in zip(self.workers, mirrors):
                    worker.info["mirror"] = mirror
                self.mirrored = {w.index: set() for w in self.workers}
            else:
                self._check_shared_run_dir()
        except BaseException:
            self.close()
            raise
        self._write_worker_list()

    def _write_worker_list(self) -> None:
        """``RUN/ray_workers.json``: each worker's index, role, pid and node, to find (or kill) a worker's process."""
        from populora_core.services.files import atomic_write_text

        workers = [
            {"index": w.index, "role": w.role, "pid": w.info.get("pid"), "node": w.info.get("node")}
            for w in self.workers
        ]
        atomic_write_text(self.run_dir / "ray_workers.json", json.dumps(workers, indent=1))

    # --- start-up ---------------------------------------------------------------------------------

    def _bundles(self) -> list[tuple[str, dict[str, float]]]:
        p = self.params
        bundle = {"CPU": float(p.cpus_per_worker)}
        if p.gpus_per_worker:
            bundle["GPU"] = float(p.gpus_per_worker)
        if p.layout == "colocated":
            return [("colocated", dict(bundle)) for _ in range(p.workers)]
        engines = p.engine_workers or 1
        engine_roles = [("engine", dict(bundle)) for _ in range(engines)]
        return engine_roles + [("trainer", dict(bundle)) for _ in range(p.workers)]

    def _check_resources(self) -> None:
        """More CPUs or GPUs asked than the cluster has: an error naming the setting (a placement group would wait)."""
        total = self.ray.cluster_resources()
        bundles = [b for _, b in self._bundles()]
        for resource, setting in (("GPU", "gpus_per_worker"), ("CPU", "cpus_per_worker")):
            want = sum(b.get(resource, 0.0) for b in bundles)
            have = float(total.get(resource, 0.0))
            if want > have + 1e-9:
                count = f"{len(bundles)} workers" + (
                    " (workers + engine_workers)" if self.params.layout == "disaggregated" else ""
                )
                raise UserError(
                    f"cluster.params.{setting}: {count} x {bundles[0].get(resource, 0.0):g} {resource} = {want:g} "
                    f"{resource}, but the Ray cluster has {have:g}; lower cluster.params.workers or {setting}"
                )

    def _start_workers(self) -> None:
        ray, p = self.ray, self.params
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        roles = self._bundles()
        self._placement_group = placement_group([b for _, b in roles], strategy=p.placement_strategy)
        ready, _ = ray.wait([self._placement_group.ready()], timeout=p.start_timeout_s)
        if not ready:
            raise UserError(
                f"cluster.params.placement_strategy: the Ray cluster could not place {len(roles)} workers "
                f"({roles[0][1]} each, {p.placement_strategy}) within {p.start_timeout_s:g} s; "
                "free resources, lower cluster.params.workers, or use PACK/SPREAD"
            )
        actor_class = ray.remote(PopulationWorker)
        threads = self.threads()
        env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
        # the recipe's runtime.cpu_isa (set by the populora command) reaches workers on a remote cluster too
        cpu_paths = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
        allocator = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # the trainers' (populora_core.services.runtime)
        for var in ("HF_HUB_OFFLINE", "HF_HOME", "PYTHONPATH", *cpu_paths, *allocator):
            if var in os.environ:
                env[var] = os.environ[var]
        runtime_env = dict(p.runtime_env)
        runtime_env["env_vars"] = {**env, **dict(runtime_env.get("env_vars") or {})}
        for index, (role, bundle) in enumerate(roles):
            actor = actor_class.options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0.0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._placement_group, index),
                runtime_env=runtime_env,
                max_restarts=0,
            ).remote(index, role, threads)
            self.workers.append(Worker(index, role, actor))
        infos = self.call("start", [(w, w.actor.describe.remote()) for w in self.workers], timed=False)
        for worker, info in zip(self.workers, infos):
            worker.info = info
        if self.plugin_files:  # a recipe may name a component a --plugin file registers
            self.call(
                "start", [(w, w.actor.load_plugin_files.remote(self.plugin_files)) for w in self.workers], timed=False
            )

    def _check_shared_run_dir(self) -> None:
        """Every worker must see a file the driver just wrote into the run directory."""
        token = secrets.token_hex(16)
        probe = self.run_dir / f".cluster-check-{token[:8]}"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text(token)
        try:
            seen = self.call("start", [(w, w.actor.sees.remote(str(probe), token)) for w in self.workers], timed=False)
        finally:
            probe.unlink(missing_ok=True)
        blind = [w for w, ok in zip(self.workers, seen) if not ok]
        if blind:
            raise UserError(
                f"--run-dir {self.run_dir}: {blind[0].where()} cannot see a file the driver wrote there; "
                "adapters and checkpoints are exchanged through the run directory, so it must be on a "
                "filesystem every Ray node mounts at the same path (NFS, a cluster filesystem), or set "
                "cluster.params.transfer: object_store to move them through Ray's object store"
            )

    def threads(self) -> int:
        """Threads each worker's torch uses: pinned, since results depend on it (Ray would pick its own)."""
        if self.params.threads_per_worker is not None:
            return int(self.params.threads_per_worker)
        env = os.environ.get("OMP_NUM_THREADS", "")
        return int(env) if env.isdigit() and int(env) > 0 else max(1, int(self.params.cpus_per_worker))

    # --- components ---------------------------------------------------------------------------------

    def gpu_bytes(self) -> int | None:
        """The smallest GPU among the workers that hold one (what an engine's ``auto`` settings are planned on)."""
        sizes = [int(w.info.get("gpu_bytes") or 0) for w in self.workers]
        return min((b for b in sizes if b), default=None)

    def with_role(self, *roles: str) -> list[Worker]:
        return [w for w in self.workers if w.role in roles]

    def engine(self, name: str, params: dict[str, Any], context: dict[str, Any]) -> Any:
        from .engine import RayEngine

        workers = self.with_role("colocated", "engine")
        traits = self.call(
            "build", [(w, w.actor.build.remote("engine", name, params, context)) for w in workers], timed=False
        )
        row_seeded = all(t["row_seeded"] for t in traits)
        return RayEngine(
            self,
            workers,
            split=row_seeded or self.params.generation_split == "always",
            served_dtypes=[t["served_dtype"] for t in traits],
        )

    def trainer(self, name: str, params: dict[str, Any], context: dict[str, Any]) -> Any:
        from .trainer import RayTrainer

        workers = self.with_role("colocated", "trainer")
        traits = self.call(
            "build", [(w, w.actor.build.remote("trainer", name, params, context)) for w in workers], timed=False
        )
        first = traits[0]
        if not first["member_states"]:
            raise UserError(
                f"trainer {name!r} (plugin {first['plugin']}) cannot be spread over Ray workers: it does not hand "
                "its optimizer state over member by member (populora_core.api.components.MemberStateTrainer); "
                "use cluster: local"
            )
        return RayTrainer(self, workers, algorithm=first["algorithm"], needs_logprobs=first["needs_sampling_logprobs"])

    # --- calls ----------------------------------------------------------------------------------------

    def call(self, what: str, calls: list[tuple[Worker, Any]], *, timed: bool = True) -> list[Any]:
        """Results of remote calls in order. Timed calls return (result, seconds inside); their wall time beyond
        the slowest worker's is Ray's overhead. A dead worker is a :class:`WorkerLost`; an error a component
        raised on purpose (a PopuloraError) comes back as itself."""
        ray = self.ray
        start = time.perf_counter()
        results = []
        if calls:  # every result pulled here at once, then read in order
            ray.wait([ref for _, ref in calls], num_returns=len(calls), fetch_local=True)
        for worker, ref in calls:
            try:
                results.append(ray.get(ref))
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
                # ObjectLostError: a file a worker wrote into the object store went with that worker
                raise WorkerLost(
                    f"{worker.where()} died during {what}: {first_line(exc)}. The run stopped; "
                    f"`populora resume {self.run_dir}` continues it from its last checkpoint"
                ) from None
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, PopuloraError):  # a clear error a component raised on purpose
                    raise cause from None
                raise
        if not timed:
            return results
        self.time.wall_s += time.perf_counter() - start
        self.time.inside_s += max((seconds for _, seconds in results), default=0.0)
        self.time.calls += 1
        return [result for result, _ in results]

    # --- run-directory files (transfer: object_store; no-ops when the run directory is shared) ----------

    @property
    def moved_bytes(self) -> int:
        """Bytes that crossed between the driver's run directory and the workers, both ways."""
        return self.transfer_bytes["shipped"] + self.transfer_bytes["fetched"]

    def ship(self, needs: Sequence[tuple[Worker, Sequence[str]]], *, again: bool = False) -> None:
        """Before calls that read these run-directory paths (transfer.units) on these workers: the ones a worker's
        mirror lacks (``again``: all of them; a checkpoint folder may be rewritten, an adapter version never is)
        go from the object store, where each is put once, to every such worker at once; mirrored paths the run
        has deleted since are dropped."""
        if not self.mirrored:
            return
        for path in [p for p in self.stored if not os.path.exists(p)]:
            del self.stored[path]
        deliveries = []
        for worker, paths in needs:
            held = self.mirrored[worker.index]
            wanted = [p for p in dict.fromkeys(paths) if again or p not in held]
            gone = sorted(p for p in held if not os.path.exists(p))
            if wanted or gone:
                deliveries.append((worker, wanted, gone))
        if not deliveries:
            return
        objects: dict[str, tuple[Any, int]] = {}
        for path in dict.fromkeys(p for _, wanted, _ in deliveries for p in wanted):
            stored = None if again else self.stored.get(path)
            objects[path] = stored if stored is not None else self._put(path, keep=not again)
        calls = [(w, w.actor.receive.remote(gone, *(objects[p][0] for p in wanted))) for w, wanted, gone in deliveries]
        self.call("transfer", calls)
        for worker, wanted, gone in deliveries:
            held = self.mirrored[worker.index]
            held.difference_update(gone)
            held.update(wanted)
            self.transfer_bytes["shipped"] += sum(objects[p][1] for p in wanted)

    def _put(self, path: str, keep: bool) -> tuple[Any, int]:
        """Driver path ``path`` into the object store (``keep``: there for later readers too)."""
        bundle = transfer.pack([path])
        stored = (self.ray.put(bundle), transfer.size(bundle))
        self.transfer_bytes["put"] += stored[1]
        if keep:
            self.stored[path] = stored
        return stored

    def fetch(self, wrote: Sequence[tuple[Worker, Sequence[str]]], *, share: bool = False) -> None:
        """After calls that wrote these run-directory paths on these workers: write them (each with its served
        copies) into the run directory, from every worker at once. ``share`` (adapter versions): the objects the
        workers put in the store stay there for the other workers that will read them (:meth:`release`)."""
        wrote = [(w, list(paths)) for w, paths in wrote if paths and self.mirrored.get(w.index) is not None]
        if not wrote:
            return
        sent = self.call("transfer", [(w, w.actor.send.remote(paths)) for w, paths in wrote])
        parts = [(w, unit, ref) for (w, _), refs in zip(wrote, sent) for unit, ref in refs.items()]
        bundles = self.call("transfer", [(w, ref) for w, _, ref in parts], timed=False)
        for (worker, unit, ref), bundle in zip(parts, bundles):
            transfer.unpack(bundle)
            size = transfer.size(bundle)
            self.transfer_bytes["fetched"] += size
            self.mirrored[worker.index].add(unit)
            if share:
                self.stored[unit] = (ref, size)

    def release(self, keep: Iterable[str]) -> None:
        """Drop the stored objects of every path but ``keep``: no worker will read them from the store again (a
        later reader gets a fresh copy from the run directory)."""
        kept = set(keep)
        for path in [p for p in self.stored if p not in kept]:
            del self.stored[path]

    def close(self) -> None:
        """Kill the actors, remove the placement group, and stop Ray if this run started it."""
        if self._closed:
            return
        self._closed = True
        self.stored.clear()
        ray = self.ray
        if self.mirrored:  # the workers' mirrors: removed by the workers, which the kill below would not let run
            try:
                ray.get([w.actor.close.remote() for w in self.workers], timeout=30)
            except Exception:  # a dead worker's mirror is its node's temporary directory to clean
                pass
        for worker in self.workers:
            try:
                ray.kill(worker.actor, no_restart=True)
            except Exception:  # already dead: nothing left to release
                pass
        if self._placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._placement_group)
        if self._started_ray:
            ray.shutdown()


def check_reachable(address: str, timeout_s: float, setting: str = "cluster.params.address") -> None:
    """A ``HOST:PORT`` (or ``ray://HOST:PORT``) address must answer within ``timeout_s``: Ray itself retries an
    unreachable one for minutes before it gives up. ``auto`` is left to Ray (it fails fast without a cluster)."""
    import socket

    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(
            f"{setting}: no Ray cluster answers at {address!r} within {timeout_s:g} s "
            f"({exc.strerror or type(exc).__name__}); start one with `ray start --head`, or give its address"
        ) from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
