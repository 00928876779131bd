"""Every hook a PopuLoRA plugin can implement.

Two families, as in simonw/llm and datasette:

* ``register_*(register)`` — called once per plugin while the plugin manager loads. ``register`` is a
  callback bound to the calling plugin: ``register(name, factory, params=ParamsModel,
  description="", **meta)``. The core records the name, the providing plugin and its version, and
  refuses a name two plugins claim. What ``factory`` must be depends on the kind and is stated on each
  hook; ``Component.build(raw_params, **context)`` hands a factory only the context arguments it names
  (or all, with ``**kwargs``), so context can grow without breaking older factories.
* lifecycle hooks — called by the training loop for observers and extensions. Their return value is
  ignored unless stated. Hook signatures are a contract: arguments may be added, never renamed or
  removed; a hookimpl may declare any subset of the arguments.

Component contracts (the Protocols) live in :mod:`populora_core.api.components`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

from ..api.hooks import hookimpl

if TYPE_CHECKING:
    from ..api.population import Population
    from ..api.runview import RunView

__all__ = ["hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker("populora")


# --- registration -------------------------------------------------------------------------------


@hookspec
def register_tasks(register: Any) -> None:
    """Register task types (AZR's deduction, abduction, induction, ...).

    ``factory(params, *, executor, rng, tasks) -> components.Task``. ``tasks`` is the run's tasks by name in
    recipe order (complete before any task method is called): induction reads its peers' buffers through it.
    """


@hookspec
def register_executors(register: Any) -> None:
    """Register program executors (the sandbox). ``factory(params, *, plugin_files) -> components.Executor``.

    ``plugin_files`` (a factory may leave it out): the absolute paths of the ``--plugin`` files this process
    loaded, for an executor that builds another one in other processes (the ``ray`` executor's actors).

    Optional ``doctor=fn() -> (row, what, warning or None)`` (any kind may register one): a quick check of this
    machine that ``populora doctor`` shows as a row, the warning among its warnings (the sandbox: whether its
    system-call filter installs here).
    """


@hookspec
def register_trainers(register: Any) -> None:
    """Register policy-update algorithms (trr++, grpo).

    ``factory(params, *, base_model, lora, seed) -> components.Trainer``. Optional ``memory=fn``,
    ``fn(params, context: memory.PlanContext) -> memory.TrainerMemory`` (params: its parsed params model, every
    default filled; ``context.recipe``: the typed recipe): the trainer's GPU memory terms for
    ``populora plan``. Optional ``sampling_logprobs=fn(params) -> bool``: what the built trainer's
    ``needs_sampling_logprobs`` will be, read before the engine is built (engines get it as ``sampling_logprobs``).
    """


@hookspec
def register_engines(register: Any) -> None:
    """Register rollout engines (hf, vllm).

    ``factory(params, *, base_model, lora, seed) -> components.RolloutEngine``; a factory may also take
    ``max_prompt_tokens`` and ``sampling_logprobs`` (the trainer reads ``Completion.logprobs`` as the sampling
    policy's: after temperature and top-p). Optional ``memory=fn``,
    ``fn(params, context: memory.PlanContext) -> memory.EngineMemory`` (params: its parsed params model, every
    default filled; ``context.recipe``: the typed recipe): the engine's GPU memory terms for
    ``populora plan``.
    """


@hookspec
def register_matchmakers(register: Any) -> None:
    """Register matchmakers (pfsp, round_robin, random). ``factory(params) -> components.Matchmaker``."""


@hookspec
def register_selectors(register: Any) -> None:
    """Register PBT selection schemes (truncation, tournament, tiered).

    ``factory(params) -> components.Selector``, whose ``select(members, rng, ready)`` returns the replacements of
    one sub-population. ``ready`` holds the ids of members that may die (PBT readiness, ``evolution.ready_after``);
    the rest still rank and may be parents. The loop refuses a replacement of a member that is not ready.
    ``python -m benchmarks.research.selection`` measures a selector on every shipped recipe: whether the youngest die
    more often than chance when all members are equal, and whether the weakest die when they differ.
    """


@hookspec
def register_operators(register: Any) -> None:
    """Register LoRA weight-space operators.

    ``factory`` is the operator itself, a pure function
    ``op(parents: list[adapters.LoraWeights], params, generator: torch.Generator) -> LoraWeights``.
    Declare the arity as meta: ``register("svd", fn, params=P, min_parents=2, max_parents=None)``
    (``max_parents=None``: no upper bound; a mutation is ``min_parents=1, max_parents=1``). The loop and
    ``populora evolve`` make children through :func:`populora_core.api.operators.apply_operator`, which checks
    the parents' count against this declaration and their compatibility before the operator runs (so an operator
    does not check them again; the declaration is its arity's one statement, listed by ``populora plugins``), and
    refuses a child that changes rank, alpha, target modules or shapes.
    """


@hookspec
def register_evaluators(register: Any) -> None:
    """Register benchmark evaluators. ``factory(params) -> components.Evaluator``."""


@hookspec
def register_base_models(register: Any) -> None:
    """Register base models by short name (``nano``). ``factory(params) -> components.BaseModel``."""


@hookspec
def register_sinks(register: Any) -> None:
    """Register metric sinks (tensorboard, wandb).

    ``factory(params, *, run_dir, resume_step) -> components.MetricSink``.

    ``resume_step`` (a factory may leave it out): the checkpoint step a resumed run continues from, 0 for a new
    run; the steps after it were logged before the interruption and are logged again, so a sink that appends to
    an earlier log drops what it holds after that step (TensorBoard's ``purge_step``, W&B's ``resume_from``).
    """


@hookspec
def register_clusters(register: Any) -> None:
    """Register clusters: where the engine and the trainer run (recipe ``cluster``; ``local`` is built in).

    ``factory(params, *, run_dir, plugin_files) -> components.Cluster``; ``run_dir`` is the run directory the
    workers must see (adapters and checkpoints are exchanged through it); ``plugin_files`` are the absolute
    paths of the ``--plugin`` files this process loaded, which the workers must load too, so that a component
    from one of them can be built there. Optional ``gpus=fn(params) -> int`` (its parsed params model): the GPUs
    the members are spread over, what ``populora plan`` plans on unless ``--gpus`` says otherwise.
    """


@hookspec
def register_commands(cli: Any) -> None:
    """Add subcommands to the ``populora`` click group (``@cli.command()``), as simonw/llm does."""


# --- lifecycle ----------------------------------------------------------------------------------


@hookspec
def on_run_start(run: RunView) -> None:
    """A run starts or resumes. Every lifecycle hook's ``run`` is a :class:`populora_core.api.runview.RunView`:
    ``recipe``, ``run_dir``, ``steps_done``, a copy of the ``population``, and ``emit(records)``."""


@hookspec
def on_run_end(run: RunView, status: str) -> None:
    """A run ends; ``status`` is ``"completed"``, ``"failed"`` or ``"interrupted"``."""


@hookspec
def on_step_start(run: RunView, step: int) -> None:
    """Step ``step`` (1-based) is about to start."""


@hookspec
def after_matchmaking(run: RunView, step: int, matches: list[Any]) -> None:
    """Teachers were paired with students; ``matches`` is a list of :class:`components.Match`.

    A hookimpl may reorder or replace entries in place to steer pairing; each teacher must still have exactly one
    match, with a student (checked after the hook: a :class:`PluginError` naming the hook and its plugins).
    """


@hookspec
def after_rewards(run: RunView, step: int, rollouts: list[Any]) -> None:
    """Rewards of this step's trained rollouts are computed, before any policy update.

    ``rollouts`` is a list of :class:`components.Rollout`; a hookimpl may adjust ``rollout.reward``
    in place (reward shaping, penalties); the trainers then see the adjusted values.
    """


@hookspec
def on_step_end(run: RunView, step: int, metrics: dict[str, Any]) -> None:
    """Step ``step`` finished; ``metrics`` is the flat dict also written to the event log."""


@hookspec
def before_evolution(run: RunView, step: int, population: Population) -> None:
    """Selection and replacement of step ``step`` are about to run. ``population`` is ``run.population``: a copy
    of the members as selection will see them (roles, versions, ``rating``, ``counters.matches``, ``born_step``,
    lineage); changing it changes nothing in the run, as for every lifecycle hook's ``run``."""


@hookspec
def after_evolution(run: RunView, step: int, events: list[dict[str, Any]]) -> None:
    """Children were born; ``events`` are the lineage records (child, parents, operator, params, seed)."""


@hookspec
def on_checkpoint(run: RunView, step: int, path: str) -> None:
    """A complete checkpoint for ``step`` was atomically written at ``path``."""
