"""``ray`` cluster and executor: the population's engine and trainer on Ray workers, the run itself in the driver;
the sandbox's programs fanned out over Ray CPU actors.

Recipe: ``cluster: {name: ray, params: {workers: 2}}``; ``executor: {name: ray, params: {executor: {name:
sandbox, params: {...}}}}`` (with any cluster, ``local`` too). The driver keeps the population, ratings, RNG
streams, evolution and checkpoints; worker actors in one placement group each host the base once and run
the recipe's engine and trainer (``colocated``) or one of them (``disaggregated``). Results are those of
the single process at equal thread counts (see README.md). No Ray import here: the plugin loads, and
``populora --help`` answers, without Ray installed; a run that asks for it without Ray is a clear error.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from populora_core.api import Params, UserError, hookimpl


class RayClusterParams(Params):
    """Where the workers run and what each one gets."""

    address: str = Field(
        "",
        description="a running Ray cluster: 'auto' or HOST:PORT of `ray start --head`; empty: the Ray this "
        "process already joined, else a local cluster started for the run (and stopped after it)",
    )
    layout: Literal["colocated", "disaggregated"] = Field(
        "colocated",
        description="colocated: every worker runs an engine and a trainer on one copy of the base (generation "
        "and training take turns on its device); disaggregated: engine workers serve every adapter while "
        "`workers` trainer workers own members",
    )
    workers: int = Field(2, ge=1, description="colocated: all workers; disaggregated: the trainer workers")
    engine_workers: int | None = Field(None, ge=1, description="disaggregated only: engine workers (default 1)")
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs reserved per worker (its placement-group bundle)")
    gpus_per_worker: float = Field(0.0, ge=0, description="GPUs reserved per worker: 1 is one GPU each")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement-group strategy for the workers' bundles (STRICT_PACK: one node)"
    )
    generation_split: Literal["exact", "always"] = Field(
        "exact",
        description="exact: a generation call is split across engine workers only when the engine is row-seeded "
        "(its samples do not depend on the other requests of a call), else it runs whole on one worker, so "
        "results equal the single process's; always: every call is split by token budget, faster with a "
        "batch-seeded engine (vllm, hf with decode: generate), but samples then depend on the number of engine workers",
    )
    transfer: Literal["run_dir", "object_store"] = Field(
        "run_dir",
        description="run_dir: adapters and checkpoint files are exchanged through the run directory, which "
        "every node must mount at the same path (checked at start); object_store: each worker keeps a private "
        "mirror and the driver ships and fetches those files through Ray's object store (nodes without a shared "
        "filesystem; every adapter version a worker reads crosses the network once)",
    )
    threads_per_worker: int | None = Field(
        None,
        ge=1,
        description="torch threads in each worker; results depend on it, so it is pinned. None: the driver's "
        "OMP_NUM_THREADS, else cpus_per_worker",
    )
    runtime_env: dict[str, Any] = Field(
        default_factory=dict, description="Ray runtime_env of the workers (env_vars are merged with the pinned ones)"
    )
    local_cpus: int | None = Field(None, ge=1, description="a local cluster's CPUs (address empty); None: Ray counts")
    local_gpus: int | None = Field(
        None, ge=0, description="a local cluster's GPUs (address empty); None: Ray counts; more than exist: fake ones"
    )
    start_timeout_s: float = Field(60.0, gt=0, description="how long to wait for the workers to be placed")
    connect_timeout_s: float = Field(10.0, gt=0, description="how long a HOST:PORT address may take to answer")

    @model_validator(mode="after")
    def _consistent(self) -> RayClusterParams:
        if self.layout == "colocated" and self.engine_workers is not None:
            raise ValueError("engine_workers is for layout: disaggregated (colocated workers all run an engine)")
        if self.address and (self.local_cpus is not None or self.local_gpus is not None):
            raise ValueError("local_cpus / local_gpus size a local cluster; with an address the cluster has its own")
        return self


class InnerExecutor(Params):
    """The executor each Ray actor runs its share of a batch in (recipe form: name and params)."""

    name: str = Field("sandbox", description="a registered executor (not ray)")
    params: dict[str, Any] = Field(default_factory=dict, description="its params")

    @model_validator(mode="after")
    def _known(self) -> InnerExecutor:
        from populora_core.api import format_validation_error, get_registry

        if self.name == "ray":
            raise ValueError("the ray executor runs another executor on its actors, not itself")
        try:
            component = get_registry().get("executor", self.name)
        except UserError as exc:  # pydantic reports ValueErrors, with the path to this field
            raise ValueError(str(exc)) from None
        try:
            component.parse_params(self.params)
        except ValidationError as err:
            raise ValueError(
                f"executor {self.name!r} (plugin {component.plugin}): {format_validation_error(err)}"
            ) from None
        return self


class RayExecutorParams(Params):
    """How many Ray CPU actors run the programs, and where."""

    executor: InnerExecutor = Field(default_factory=InnerExecutor, description="what each actor runs programs in")
    actors: int = Field(
        0, ge=0, description="executor actors; 0: as many as the Ray cluster's free CPUs hold at start (at least 1)"
    )
    cpus_per_actor: float = Field(
        1.0, gt=0, description="CPUs each actor reserves; its inner executor's `workers: 0` becomes this many"
    )
    scheduling_strategy: Literal["SPREAD", "DEFAULT"] = Field(
        "SPREAD", description="SPREAD: actors over every node's CPUs; DEFAULT: Ray packs them"
    )
    address: str = Field(
        "",
        description="a running Ray cluster ('auto' or HOST:PORT); empty: the Ray this process already joined "
        "(cluster: ray), else a local one started for the run",
    )
    local_cpus: int | None = Field(None, ge=1, description="a local cluster's CPUs (address empty); None: Ray counts")
    start_timeout_s: float = Field(60.0, gt=0, description="how long the actors may take to be placed and start")
    connect_timeout_s: float = Field(10.0, gt=0, description="how long a HOST:PORT address may take to answer")


def make_executor(params: RayExecutorParams, *, plugin_files: tuple[str, ...] | list[str] = ()) -> Any:
    from .executor import RayExecutor

    return RayExecutor(params, plugin_files=plugin_files)


@hookimpl
def register_executors(register):
    register(
        "ray",
        make_executor,
        params=RayExecutorParams,
        description="each batch of programs over Ray CPU actors, each running an inner executor (the sandbox)",
    )


@hookimpl
def register_clusters(register):
    from .cluster import RayCluster

    register(
        "ray",
        RayCluster,
        params=RayClusterParams,
        description="worker actors in a Ray placement group: colocated engine + trainer, or disaggregated",
        gpus=planned_gpus,
    )


def planned_gpus(params: RayClusterParams) -> int:
    """The GPUs ``populora plan`` spreads the members over: the (trainer) workers' reserved GPUs, at least one."""
    return max(1, math.ceil(params.workers * params.gpus_per_worker))
