"""The components of a run, built once from its parsed recipe, and what every step phase reads from them.

Built in one place so a run, ``populora seed`` and the benchmarks get the same wiring: the cluster first (the
engine and the trainer go onto its workers), then the executor, the tasks in recipe order, engine, trainer,
matchmaker, the evolution's selector and operators, and the sinks. Factories receive the params the recipe's
validation parsed (:meth:`ComponentRef.build_params`), so a recipe is parsed once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..api.components import (
    AdapterRef,
    BaseModel,
    Cluster,
    Executor,
    LoraSettings,
    Matchmaker,
    MetricSink,
    Problem,
    RolloutEngine,
    SamplingParams,
    Selector,
    Task,
    Trainer,
)
from ..api.errors import PluginError, UserError, run_all
from ..api.params import Component, Params
from ..api.population import Member
from ..api.rng import Streams
from ..api.schema import LOCAL_CLUSTER, Recipe
from ..plugin.manager import PluginManager
from ..services.batching import per_task
from .run_dir import RunDir

T = TypeVar("T")


@dataclass
class Components:
    """A run's built components with its recipe, seed streams and run directory: what the phases read."""

    recipe: Recipe
    streams: Streams
    run_dir: RunDir
    registry: Any
    base_model: BaseModel
    lora: LoraSettings
    cluster: Cluster | None
    executor: Executor
    tasks: dict[str, Task]
    engine: RolloutEngine
    trainer: Trainer
    matchmaker: Matchmaker
    selector: Selector | None
    operators: list[tuple[Component, Params, float]] = field(default_factory=list)
    sinks: list[MetricSink] = field(default_factory=list)

    def adapter_ref(self, member: Member) -> AdapterRef:
        return AdapterRef(member.version_name, str(self.run_dir.adapter_path(member.version_name)))

    def sampling(self, step: int, phase: str, *, n: int, max_tokens: int, logprobs: bool = False) -> SamplingParams:
        """Rollout sampling settings with a seed derived from (recipe seed, step, phase).

        Log-probs are asked for when the trainer reads them, or when ``logprobs`` (the proposals: the step
        metrics' ``token_nll``); asking never changes the sampled tokens."""
        cfg = self.recipe.rollout
        return SamplingParams(
            n=n,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_tokens=max_tokens,
            seed=self.streams.seed_for(step, phase),
            max_prompt_tokens=cfg.max_prompt_tokens,
            logprobs=logprobs or self.trainer.needs_sampling_logprobs,
        )

    def parse_proposals(
        self, texts: list[str], task_names: list[str], contexts: list[Any], proposers: list[str]
    ) -> list[Problem]:
        """Every task parses and validates its own proposals in one batch; problems come back in input order."""
        return self.per_task(
            task_names,
            lambda task, idx: task.parse_proposals(
                [texts[i] for i in idx], [contexts[i] for i in idx], [proposers[i] for i in idx]
            ),
        )

    def per_task(self, task_names: Sequence[str | None], batch: Callable[[Task, list[int]], Sequence[T]]) -> list[T]:
        """:func:`per_task` over the run's tasks."""
        return per_task(self.tasks, task_names, batch)

    def close(self) -> None:
        """Close what holds processes, files or workers; the cluster last (the engine and trainer live on it)."""
        close_all([self.engine, self.executor, *self.sinks, self.cluster])


def close_all(parts: list[Any]) -> None:
    """``close()`` each part in order, every one even if another fails (the first failure is raised after)."""

    def closer(part: Any) -> Callable[[], object]:
        return lambda: part.close()  # looked up when it runs: a part without close fails alone

    run_all([closer(part) for part in parts if part is not None])


def build_components(
    recipe: Recipe,
    run_dir: RunDir,
    manager: PluginManager,
    *,
    base_model: BaseModel | None = None,
    resume_step: int = 0,
) -> Components:
    """Every component the recipe names; on failure what was built is closed (a started cluster above all)."""
    reg = manager.registry
    streams = Streams(recipe.seed)
    base = base_model or reg.base_model(recipe.base_model.name, recipe.base_model.params)
    cluster: Cluster | None = None
    if recipe.cluster.name == LOCAL_CLUSTER:
        refuse_idle_gpus()
    else:
        cluster = reg.get("cluster", recipe.cluster.name).build(
            recipe.cluster.build_params(), run_dir=run_dir.path, plugin_files=manager.plugin_files
        )
    built: list[Any] = []  # closed, last first, when a later component fails to build

    def check(part: Any, protocol: type, kind: str, name: str) -> Any:
        built.append(part)
        check_implements(part, protocol, kind, name)
        return part

    try:
        executor = check(
            reg.get("executor", recipe.executor.name).build(
                recipe.executor.build_params(), plugin_files=manager.plugin_files
            ),
            Executor,
            "executor",
            recipe.executor.name,
        )
        tasks: dict[str, Any] = {}  # filled in recipe order; each task factory may take it as `tasks`
        for i, ref in enumerate(recipe.tasks):
            if ref.name in tasks:
                raise UserError(f"task {ref.name!r} is listed twice in the recipe")
            task = reg.get("task", ref.name).build(
                ref.build_params(), executor=executor, rng=streams.task_rng(i), tasks=tasks
            )
            check_implements(task, Task, f"tasks.{i}", ref.name)
            tasks[ref.name] = task
        ctx = {"base_model": base, "lora": recipe.lora, "seed": recipe.seed}
        engine_ctx = {
            **ctx,
            "max_prompt_tokens": recipe.rollout.max_prompt_tokens,
            "sampling_logprobs": reads_sampling_logprobs(reg, recipe),
        }
        engine_params, unplanned = planned_engine_params(recipe, reg, base, cluster, run_dir)
        warn_unchecked_vllm(recipe.engine.name)
        try:
            if cluster is None:
                engine = reg.get("engine", recipe.engine.name).build(engine_params, **engine_ctx)
            else:
                engine = cluster.engine(recipe.engine.name, engine_params, engine_ctx)
        except UserError as exc:
            if unplanned is None:
                raise
            raise UserError(f"{exc} (populora run could not plan the recipe on this GPU: {unplanned})") from None
        check(engine, RolloutEngine, "engine", recipe.engine.name)
        if cluster is None:
            trainer = reg.get("trainer", recipe.trainer.name).build(recipe.trainer.build_params(), **ctx)
        else:
            trainer = cluster.trainer(recipe.trainer.name, recipe.trainer.build_params(), ctx)
        check_implements(trainer, Trainer, "trainer", recipe.trainer.name)
        evo = recipe.evolution
        operators = []
        for ref in evo.operators if evo.every else []:
            component = reg.get("operator", ref.name)
            operators.append((component, _parsed(component, ref), ref.weight))
        sinks = [
            check(
                reg.get("sink", ref.name).build(ref.build_params(), run_dir=run_dir.path, resume_step=resume_step),
                MetricSink,
                f"sinks.{i}",
                ref.name,
            )
            for i, ref in enumerate(recipe.sinks)
        ]
        matchmaker = reg.get("matchmaker", recipe.matchmaker.name).build(recipe.matchmaker.build_params())
        check_implements(matchmaker, Matchmaker, "matchmaker", recipe.matchmaker.name)
        return Components(
            recipe=recipe,
            streams=streams,
            run_dir=run_dir,
            registry=reg,
            base_model=base,
            lora=recipe.lora,
            cluster=cluster,
            executor=executor,
            tasks=tasks,
            engine=engine,
            trainer=trainer,
            matchmaker=matchmaker,
            selector=reg.get("selector", evo.selector.name).build(evo.selector.build_params()) if evo.every else None,
            operators=operators,
            sinks=sinks,
        )
    except BaseException:
        close_all([*reversed(built), cluster])
        raise


def reads_sampling_logprobs(registry: Any, recipe: Recipe) -> bool:
    """What the recipe's trainer's ``needs_sampling_logprobs`` will say, known before the engine is built (from
    its registered ``sampling_logprobs=fn(params)``; False without one), so the engine can report the sampling
    policy's log-probs (after temperature and top-p) rather than the raw distribution's."""
    fn = registry.get("trainer", recipe.trainer.name).meta.get("sampling_logprobs")
    return bool(fn(recipe.trainer.build_params())) if fn is not None else False


def planned_engine_params(
    recipe: Recipe, registry: Any, base: BaseModel, cluster: Cluster | None, run_dir: RunDir
) -> tuple[Any, str | None]:
    """The engine's params for the GPU it runs on, from the run's one plan of the recipe there: its ``auto``
    settings (vLLM's sleep and GPU share) as the plan chose them, the choice written to run.log, and a warning
    when the plan says the recipe will not fit; with why no plan could be made, if none could. Unchanged on the CPU,
    where they mean nothing; the recipe keeps ``auto``, so a resume on another GPU chooses again.

    On its own GPU the run plans on the total memory, with a row for what other processes hold there at start
    (the free memory, less this process's CUDA context, which the trainer's terms count); run.log says which."""
    import warnings

    from ..services.gpu import CUDA_CONTEXT, gpu_held_by_others, gpu_memory_line, visible_gpu_memory
    from .plan import cluster_gpus, plan_model

    params = recipe.engine.build_params()
    held = 0
    if cluster is None:
        free, gpu_bytes = visible_gpu_memory()
        gpus = 1
        if gpu_bytes:
            held = gpu_held_by_others(free, gpu_bytes, CUDA_CONTEXT)
            run_dir.log_line(gpu_memory_line(free, gpu_bytes, held))
    else:
        gpu_bytes, gpus = cluster.gpu_bytes() or 0, cluster_gpus(registry, recipe.cluster)[0]
        if gpu_bytes:
            run_dir.log_line(f"GPU memory: {gpu_bytes / 2**30:.1f} GiB total per worker GPU: planned on total memory")
    if not gpu_bytes:
        return params, None
    try:
        config = Path(base.path) / "config.json"
        plan = plan_model(recipe, registry, None, gpu_bytes, gpus, config, held=held)
    except Exception as exc:  # planning never stops a run: an engine that needs the plan's choice says so
        run_dir.log_line(f"plan: not made ({exc}); the engine gets its params as written")
        return params, str(exc)
    if not plan["fits"]:
        warnings.warn(f"populora plan: {plan['verdict']}", stacklevel=2)
    chosen = {key.removeprefix("engine.params."): value for key, value in plan.get("auto", {}).items()}
    if chosen:
        run_dir.log_line(f"plan: {plan['notes'][0]}; {plan['verdict']}")
        params = registry.get("engine", recipe.engine.name).parse_params({**params.model_dump(), **chosen})
    return params, None


def plan_and_build_engine(
    name: str,
    params: Mapping[str, Any],
    *,
    who: str,
    base_model: BaseModel,
    lora: LoraSettings,
    seed: int,
    log: Callable[[str], object] | None = None,
    **context: Any,
) -> Any:
    """Engine ``name`` built outside a run (``populora eval``, a benchmark): on a GPU its ``auto`` settings are
    chosen by a plan of the engine alone there (nothing trains beside it; what other processes hold, this one's
    CUDA context included, is a row), the choice given to ``log``; on the CPU as written. ``who`` names the builder
    in that line and, when no plan could be made and the engine refuses ``auto``, in the error."""
    import warnings

    from ..plugin.manager import get_registry
    from ..services.gpu import gpu_held_by_others, visible_gpu_memory
    from .plan import plan_engine_alone

    registry = get_registry()
    warn_unchecked_vllm(name)
    raw, failure = dict(params), None
    free, total = visible_gpu_memory()
    if total:
        try:
            held = gpu_held_by_others(free, total, 0)
            plan = plan_engine_alone(name, raw, base_model, lora, registry, total, held)
        except Exception as exc:  # the engine says whether it needed the plan
            failure = f"{type(exc).__name__}: {exc}" if not isinstance(exc, UserError) else str(exc)
        else:
            chosen = {key.removeprefix("engine.params."): value for key, value in plan.get("auto", {}).items()}
            raw.update(chosen)
            if chosen and log is not None:
                log(f"{who}: engine {name!r} alone on this GPU: {plan['notes'][0]}; {plan['verdict']}")
            if not plan["fits"]:
                warnings.warn(f"{who}: engine {name!r} alone on this GPU: {plan['verdict']}", stacklevel=2)
    try:
        return registry.get("engine", name).build(raw, base_model=base_model, lora=lora, seed=seed, **context)
    except UserError as exc:
        if failure is None:
            raise
        raise UserError(f"{exc} ({who} could not plan engine {name!r} alone on this GPU: {failure})") from None


def warn_unchecked_vllm(engine: str) -> None:
    """Building the vllm engine with a GPU vLLM outside the range its calls were read against: a warning (it may
    work), the one ``populora doctor`` gives."""
    if engine != "vllm":
        return
    import warnings

    from ..services.installed import unchecked_vllm, version

    outside = unchecked_vllm(version("vllm"))
    if outside:
        warnings.warn(outside, stacklevel=3)


def refuse_idle_gpus(visible: int | None = None) -> None:
    """A run in one process uses one GPU: on a node with several visible, that is almost never what its user
    meant (an 8-GPU node running on GPU 0 alone for days), so it is an error naming both ways out.

    ``visible``: the CUDA device count (None: ask torch, which CUDA_VISIBLE_DEVICES already narrowed).
    """
    if visible is None:
        import torch

        from ..services.gpu import check_visible_devices

        check_visible_devices()  # CUDA_VISIBLE_DEVICES hiding every GPU: an error before anything is built
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible > 1:
        raise UserError(
            f"cluster: {visible} GPUs are visible, but a run in one process (cluster: local) would use GPU 0 "
            f"alone. To use them all, add `cluster=ray cluster.params.workers={visible} "
            "cluster.params.gpus_per_worker=1` to the command (the Ray plugin's colocated placement, started on "
            "this node; recipes/azr_7b_ray_node.yaml is that recipe); to use one on purpose, run it with "
            "CUDA_VISIBLE_DEVICES=0"
        )


def check_implements(built: Any, protocol: type, kind: str, name: str) -> None:
    """A component the loop cannot drive (a member of its protocol missing) is an error before the run starts,
    not an AttributeError in its first step."""
    if not isinstance(built, protocol):
        members = {n for cls in protocol.__mro__ for n in (*vars(cls), *getattr(cls, "__annotations__", {}))}
        missing = sorted(n for n in members if not n.startswith("_") and not hasattr(built, n))
        raise PluginError(
            f"{kind} {name!r} ({type(built).__name__}) lacks {', '.join(missing)}: subclass "
            f"populora_core.api.components.{protocol.__name__} to inherit the optional members' defaults (plugin API 4)"
        )


def _parsed(component: Component, ref: Any) -> Params:
    params = ref.build_params()
    return params if isinstance(params, Params) else component.parse_params(params)
