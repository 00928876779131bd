"""The ``ray`` executor: each batch of programs fanned out over Ray CPU actors, each running the inner executor.

A program's result is a function of its job alone (a fresh process per program; each hash variant's
``PYTHONHASHSEED`` derives from the inner executor's own seed), not of the process or node that ran it, so
a run gets the results it would get from the inner executor in the driver. Jobs are dealt to the actors in
turn (job i to actor i mod n: the slow programs of a batch, which tend to come together, are spread). A
program has no effect outside its sandbox, so the jobs of an actor that died (killed, node lost) run again
once on a fresh actor; a second loss stops the run with a clear error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from populora_core.api.components import ExecJob, ExecResult, Executor
from populora_core.api.errors import UserError

from .cluster import WorkerLost, connect, first_line, import_ray


class ExecutorHost:
    """One actor: the inner executor, built from this process's registry (``ray.remote`` is applied at start)."""

    def __init__(self, name: str, params: dict[str, Any], plugin_files: list[str], cpus: int) -> None:
        from populora_core.api import get_registry

        component = get_registry(plugin_files).get("executor", name)
        parsed = component.parse_params(params)
        if getattr(parsed, "workers", None) == 0:  # "one per CPU core": the node's cores are not this actor's
            parsed = parsed.model_copy(update={"workers": cpus})
        self.executor = component.build(parsed)

    def describe(self) -> dict[str, Any]:
        import ray

        return {"pid": os.getpid(), "node": ray.util.get_node_ip_address()}

    def run_batch(self, jobs: Sequence[ExecJob]) -> list[ExecResult]:
        return self.executor.run_batch(jobs)

    def close(self) -> None:
        self.executor.close()


class RayExecutor(Executor):
    """The driver's executor: ``run_batch`` splits a batch over the actors and puts the results back in order."""

    def __init__(self, params: Any, *, plugin_files: Sequence[str] = ()) -> None:
        self.params = params
        self.plugin_files = [str(f) for f in plugin_files]
        self.ray = import_ray("executor.name: ray")
        self._started_ray = connect(
            self.ray,
            params.address,
            params.connect_timeout_s,
            local_cpus=params.local_cpus,
            setting="executor.params.address",
        )
        self.actors: list[Any] = []
        self.restarts = 0  # actors replaced after a loss
        try:
            count = params.actors or self._fitting_actors()
            self._check_resources(count)
            self.actors = [self._start_actor() for _ in range(count)]
            self.where = self._wait_ready(self.actors)
        except BaseException:
            self.close()
            raise

    def _fitting_actors(self) -> int:
        free = float(self.ray.available_resources().get("CPU", 0.0))
        return max(1, int(free // self.params.cpus_per_actor))

    def _check_resources(self, count: int) -> None:
        free = float(self.ray.available_resources().get("CPU", 0.0))
        want = count * self.params.cpus_per_actor
        if want > free + 1e-9:
            raise UserError(
                f"executor.params.actors: {count} actors x {self.params.cpus_per_actor:g} CPU = {want:g} CPU, but "
                f"the Ray cluster has {free:g} CPU free (the cluster's workers hold theirs); lower "
                "executor.params.actors or cpus_per_actor"
            )

    def _start_actor(self) -> Any:
        p = self.params
        env = {"TOKENIZERS_PARALLELISM": "false"}
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        host = self.ray.remote(ExecutorHost).options(
            num_cpus=p.cpus_per_actor,
            scheduling_strategy=p.scheduling_strategy,
            max_restarts=0,
            runtime_env={"env_vars": env},
        )
        return host.remote(p.executor.name, p.executor.params, self.plugin_files, max(1, int(p.cpus_per_actor)))

    def _wait_ready(self, actors: list[Any]) -> list[dict[str, Any]]:
        """Where each actor runs, once all have built their executor; a start-up error names the inner executor."""
        refs = [a.describe.remote() for a in actors]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=self.params.start_timeout_s)
        if len(ready) < len(refs):
            raise UserError(
                f"executor.params.actors: {len(refs) - len(ready)} of {len(refs)} executor actors were not "
                f"placed within {self.params.start_timeout_s:g} s; free CPUs or lower executor.params.actors"
            )
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayActorError as exc:
            raise UserError(
                f"executor.params.executor: the {self.params.executor.name!r} executor did not start on a Ray "
                f"actor: {first_line(exc)}"
            ) from None

    def run_batch(self, jobs: Sequence[ExecJob]) -> list[ExecResult]:
        if not jobs:
            return []
        n = min(len(self.actors), len(jobs))
        parts = [list(range(k, len(jobs), n)) for k in range(n)]
        refs = [self.actors[k].run_batch.remote([jobs[i] for i in part]) for k, part in enumerate(parts)]
        results: list[ExecResult | None] = [None] * len(jobs)
        for k, (part, ref) in enumerate(zip(parts, refs)):
            for i, result in zip(part, self._results(k, ref, [jobs[i] for i in part])):
                results[i] = result
        return results  # type: ignore[return-value]

    def _results(self, k: int, ref: Any, jobs: list[ExecJob]) -> list[ExecResult]:
        """Actor k's results; if it died, a fresh actor in its place runs its jobs again, once."""
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            lost = first_line(exc)
        self.restarts += 1
        self._kill(self.actors[k])
        self.actors[k] = self._start_actor()
        self._wait_ready([self.actors[k]])
        started = time.perf_counter()
        try:
            return ray.get(self.actors[k].run_batch.remote(jobs))
        except ray.exceptions.RayActorError as exc:
            raise WorkerLost(
                f"executor 'ray': an executor actor died ({lost}) and its replacement died too after "
                f"{time.perf_counter() - started:.1f} s ({first_line(exc)}); the run stopped, "
                "`populora resume RUN_DIR` continues it from its last checkpoint"
            ) from None

    def _kill(self, actor: Any) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:  # already dead
            pass

    def close(self) -> None:
        """Close every inner executor (their sandbox processes end with them), then the actors; Ray if started here."""
        actors, self.actors = self.actors, []
        if actors:
            try:
                self.ray.get([a.close.remote() for a in actors], timeout=30)
            except Exception:  # a dead actor's processes died with it
                pass
        for actor in actors:
            self._kill(actor)
        if self._started_ray:
            self._started_ray = False
            self.ray.shutdown()
