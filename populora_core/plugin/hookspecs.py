"""Every hook a PopuLoRA plugin can implement, each documented parameter by parameter (``:param name:``).

Two families, as in simonw/llm and datasette:

* ``register_*(register)``: a plugin's components. The plugin manager calls a plugin's registration hookimpls
  once, as it adds the plugin, with a ``register`` callback bound to that plugin:
  ``register(name, factory, params=ParamsModel, description="", **meta)``. The core records the name, the
  providing plugin and its version, and refuses a name two plugins claim. What ``factory`` must be depends on the
  kind and is stated on each hook; ``Component.build(raw_params, **context)`` hands a factory only the context
  arguments it names (or all, with ``**kwargs``), so context can grow without breaking older factories. A plugin
  added late (a ``--plugin`` file) registers as it is added, as pluggy's ``historic`` would do, which these hooks
  are not only because each plugin gets its own ``register`` (pluggy replays one set of arguments to all);
  ``register_commands`` is: a plugin added after the command line called it still adds its commands.
* lifecycle hooks: called by the training loop, every hookimpl in turn, for observers and extensions. Each
  receives the run as a :class:`populora_core.api.runview.RunView`. None is ``firstresult``: the loop uses no
  hook's answer, and a hookimpl steers a run only by changing in place what a hook says it may change.

Hook signatures are a contract: arguments may be added, never renamed or removed; a hookimpl may declare any
subset of the arguments. Component contracts (the Protocols) live in :mod:`populora_core.api.components`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

from ..api.hooks import hookimpl

if TYPE_CHECKING:
    import click

    from ..api.population import Population
    from ..api.records import Match, Rollout
    from ..api.runview import RunView

__all__ = ["hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker("populora")

Register = Callable[..., None]


# --- registration -------------------------------------------------------------------------------


@hookspec
def register_tasks(register: Register) -> None:
    """Register task types (AZR's deduction, abduction, induction, ...).

    Called once per plugin, as the plugin manager adds it.

    ``factory(params, *, executor, rng, tasks) -> components.Task``, handed only the keywords it names: ``executor`` the
    run's program executor, ``rng`` its random stream, ``tasks`` the run's tasks by name in recipe order (complete
    before a task method is called; induction reads its peers' buffers through it).

    A task need not be about code. Its problems are its own dataclass: ``components.Problem`` (task type, validity,
    error, proposer, metrics, signature) plus the task's payload fields, named as the task's ``problem_type`` (AZR's
    ``CodeProblem``: program, inputs, outputs, message). The core reads no payload field: ``tasks/problems.jsonl``
    records them after ``proposer_version``, a problem file is read through the task's ``load_problem(record)``
    (default: each field checked against its type; a record that does not fit is a user error naming the file, line and
    task), and what else the loop needs it asks through optional members with defaults: ``proposer`` (data:
    ``ProposerCapabilities(authors_problem=False)`` keeps AZR induction's pool programs out of the teachers' numbers),
    ``record_fields`` (a problem record's task fields; AZR's ``teacher_program``), ``problem_key`` (seed and probe
    dedup; default the whole payload), ``problem_metrics`` (``task/<name>/<key>`` of a step's valid proposals; none by
    default), ``teacher_metrics`` (keys of ``Problem.metrics`` averaged per teacher; none by default), and difficulty as
    data: ``difficulty_levels`` (the levels a problem can have, easiest first; default ``()``, the task reports no
    difficulty) with ``difficulty(problem) -> int | None`` (a valid problem's level, one of them; default None). A task
    with levels gets every step ``member/<teacher>/difficulty`` (the mean level of the teacher's valid proposals),
    ``teacher/difficulty`` (all teachers) and ``member/<student>/solve_rate_at_level/<L>`` (the student's mean solve
    rate on the valid level-L proposals it answered as matched student; None where it answered none); with two tasks or
    more that declare levels each key names the task after the member (``member/<id>/<task>/difficulty``,
    ``teacher/<task>/difficulty``). ``populora report`` draws both per member (``populora_arith`` declares digits 1-6).

    :param register: ``register(name, factory, params=ParamsModel, description="", **meta)``, bound to this
        plugin: call it once per task type the plugin provides.
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def register_executors(register: Register) -> None:
    """Register program executors (the sandbox).

    Called once per plugin, as the plugin manager adds it.

    ``factory(params, *, plugin_files) -> components.Executor``. ``plugin_files`` (a factory may leave it out): the
    absolute paths of the ``--plugin`` files this process loaded, for an executor that builds another one in other
    processes (the ``ray`` executor's actors).

    :param register: ``register(name, factory, params=ParamsModel, description="", **meta)``, bound to this
        plugin: call it once per executor. Optional meta ``doctor=fn() -> (row, what, warning or None)`` (any kind
        may register one): a quick check of this machine that ``populora doctor`` shows as a row, the warning among
        its warnings (the sandbox: whether its system-call filter installs here).
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def register_trainers(register: Register) -> None:
    """Register policy-update algorithms (trr++, grpo).

    Called once per plugin, as the plugin manager adds it.

    ``factory(params, *, base_model, lora, seed) -> components.Trainer``: ``base_model`` the run's
    ``components.BaseModel``, ``lora`` the recipe's LoRA section, ``seed`` the recipe's seed.

    :param register: ``register(name, factory, params=ParamsModel, description="", **meta)``, bound to this
        plugin: call it once per trainer. Optional meta ``memory=fn``,
        ``fn(params, context: memory.PlanContext) -> memory.TrainerMemory`` (``params``: the trainer's parsed
        params model, every default filled in; ``context.recipe``: the typed recipe): the trainer's GPU memory
        terms for ``populora plan`` (``populora_trainers/memory.py`` has the built-ins'). Optional meta
        ``sampling_logprobs=fn(params) -> bool``: what the built trainer's ``needs_sampling_logprobs`` will be,
        read before the engine is built (engines get it as ``sampling_logprobs``).
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def register_engines(register: Register) -> None:
    """Register rollout engines (hf, vllm).

    Called once per plugin, as the plugin manager adds it.

    ``factory(params, *, base_model, lora, seed) -> components.RolloutEngine``; a factory may also take
    ``max_prompt_tokens`` (the recipe's ``rollout.max_prompt_tokens``) and ``sampling_logprobs`` (whether the
    trainer reads ``Completion.logprobs`` as the sampling policy's: after temperature and top-p).

    :param register: ``register(name, factory, params=ParamsModel, description="", **meta)``, bound to this
        plugin: call it once per engine. Optional meta ``memory=fn``,
        ``fn(params, context: memory.PlanContext) -> memory.EngineMemory`` (``params``: the engine's parsed params
        model, every default filled in; ``context.recipe``: the typed recipe): the engine's own GPU memory terms
        for ``populora plan`` (pure arithmetic on the model's shape; ``populora_engines/memory.py`` has both
        built-ins').
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def register_matchmakers(register: Register) -> None:
    """Register matchmakers (pfsp, round_robin, random).

    Called once per plugin, as the plugin manager adds it.

    ``factory(params) -> components.Matchmaker``. Its ``update_ratings(outcomes, members)`` receives one
    ``MatchOutcome`` per match: the student's mean solve rate over the valid problems and ``problem_rates``, each
    generated proposal's rate (None: invalid, or every answer dropped). The core counts a rated match for
    readiness (``operators.count_matches``).

    :param register: ``register(name, factory, params=ParamsModel, description="", **meta)``, bound to this
        plugin: call it once per matchmaker.
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def register_selectors(register: Register) -> None:
    """Register PBT selection schemes (truncation, tournament, tiered).

    Called once per plugin, as the plugin manager adds it.

    ``factory(params) -> components.Selector``, whose ``select(members, rng, ready)`` returns the replacements of
    one sub-population. ``ready`` holds the ids of members that may die (PBT readiness, ``evolution.ready_after``);
    the rest still rank and may be parents. The loop refuses a replacement of a member that is not ready.
    ``python -m benchmarks.research.selection`` measures a selector on every shipped recipe: whether the youngest
    die more often than chance when all members are equal, and whether the weakest die when they differ.

    A selector's optional ``survivors(n)`` says how many lines of ``n`` members one selection keeps (the built-in
    ones: members neither dead nor replaced by another's child; a member of ``tiered`` mutated in place keeps its
    line). A recipe whose selector keeps fewer than 2 in an evolving role is a recipe error: that role would fall
    back to one lineage at every replacement (2 members under truncation do).

    :param register: ``register(name, factory, params=ParamsModel, description="", **meta)``, bound to this
        plugin: call it once per selector.
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def register_operators(register: Register) -> None:
    """Register LoRA weight-space operators.

    Called once per plugin, as the plugin manager adds it.

    ``factory`` is the operator itself, a pure function
    ``op(parents: list[lora.LoraWeights], params, generator: torch.Generator) -> LoraWeights``. The loop and
    ``populora evolve`` make children through :func:`populora_core.services.operators.apply_operator`, which checks
    the parents' count against the declared arity and their compatibility before the operator runs (so an
    operator does not check them again; the declaration is its arity's one statement, listed by
    ``populora plugins``), and refuses a child that changes rank, alpha, target modules or shapes.

    :param register: ``register(name, factory, params=ParamsModel, description="", **meta)``, bound to this
        plugin: call it once per operator, declaring the arity as meta:
        ``register("svd", fn, params=P, min_parents=2, max_parents=None)`` (``max_parents=None``: no upper bound;
        a mutation is ``min_parents=1, max_parents=1``).
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def register_evaluators(register: Register) -> None:
    """Register benchmark evaluators.

    Called once per plugin, as the plugin manager adds it. ``factory(params) -> components.Evaluator``.

    :param register: ``register(name, factory, params=ParamsModel, description="", **meta)``, bound to this
        plugin: call it once per evaluator.
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def register_base_models(register: Register) -> None:
    """Register base models by short name (``nano``).

    Called once per plugin, as the plugin manager adds it. ``factory(params) -> components.BaseModel``.

    :param register: ``register(name, factory, params=ParamsModel, description="", **meta)``, bound to this
        plugin: call it once per base model; a recipe's ``base_model`` may then name it.
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def register_sinks(register: Register) -> None:
    """Register metric sinks (tensorboard, wandb).

    Called once per plugin, as the plugin manager adds it.

    ``factory(params, *, run_dir, resume_step) -> components.MetricSink``. ``resume_step`` (a factory may leave it
    out): the checkpoint step a resumed run continues from, 0 for a new run; the steps after it were logged before
    the interruption and are logged again, so a sink that appends to an earlier log drops what it holds after that
    step (TensorBoard's ``purge_step``, W&B's ``resume_from``).

    :param register: ``register(name, factory, params=ParamsModel, description="", **meta)``, bound to this
        plugin: call it once per sink.
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def register_clusters(register: Register) -> None:
    """Register clusters: where the engine and the trainer run (recipe ``cluster``; ``local`` is built in).

    Called once per plugin, as the plugin manager adds it.

    ``factory(params, *, run_dir, plugin_files) -> components.Cluster``; ``run_dir`` is the run directory the
    workers must see (adapters and checkpoints are exchanged through it); ``plugin_files`` are the absolute paths
    of the ``--plugin`` files this process loaded, which the workers must load too, so that a component from one of
    them can be built there.

    :param register: ``register(name, factory, params=ParamsModel, description="", **meta)``, bound to this
        plugin: call it once per cluster. Optional meta ``gpus=fn(params) -> int`` (``params``: the cluster's
        parsed params model): the GPUs the members are spread over, what ``populora plan`` plans on unless
        ``--gpus`` says otherwise.
    :returns: nothing; a returned value is ignored.
    """


@hookspec(historic=True)
def register_commands(cli: click.Group) -> None:
    """Add subcommands to the ``populora`` command line, as simonw/llm does.

    Called once, the first time the command line lists or looks up its commands, for every plugin loaded then;
    a plugin added to the same plugin manager afterwards is called as it is added (a ``historic`` hook).

    :param cli: the ``populora`` click group; add a command with ``@cli.command()``.
    :returns: nothing; a returned value is ignored.
    """


# --- lifecycle ----------------------------------------------------------------------------------


@hookspec
def on_run_start(run: RunView) -> None:
    """A run starts or resumes.

    Called once as ``populora run`` starts a run or ``populora resume`` resumes one, before a new run's base-model
    probe and its first step.

    :param run: the run as hooks see it: ``recipe``, ``run_dir``, ``steps_done`` (0 for a new run, the
        checkpoint's step for a resumed one), a copy of the ``population``, and ``emit(records)``.
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def on_run_end(run: RunView, status: str) -> None:
    """A run ends, however it ends.

    Called once per ``on_run_start``, after the last step, the stop's checkpoint or the error, before the run's
    components are closed.

    :param run: the run as hooks see it (``steps_done``: the steps completed).
    :param status: ``"completed"``, ``"failed"`` (an exception ended it) or ``"interrupted"`` (Ctrl-C, SIGTERM or
        SIGUSR1).
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def on_step_start(run: RunView, step: int) -> None:
    """A step is about to start.

    Called at the start of every step, before matchmaking.

    :param run: the run as hooks see it (``steps_done`` is ``step - 1``).
    :param step: the step about to run, 1-based.
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def after_matchmaking(run: RunView, step: int, matches: list[Match]) -> None:
    """Teachers were paired with students.

    Called every step, after the matchmaker paired the members and before any teacher proposes.

    :param run: the run as hooks see it.
    :param step: the step being run, 1-based.
    :param matches: the step's pairs, a list of :class:`populora_core.api.records.Match` (teacher, student,
        expected solve rate); a hookimpl may reorder or replace entries in place, and the step uses the list as
        left if each teacher still has one match, with a student (else a PluginError naming the hook's plugins).
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def after_rewards(run: RunView, step: int, rollouts: list[Rollout]) -> None:
    """Rewards of this step's trained rollouts are computed, before any policy update.

    Called every step, after grading and rating and before training.

    :param run: the run as hooks see it.
    :param step: the step being run, 1-based.
    :param rollouts: the rollouts the trainer will learn from, a list of :class:`populora_core.api.records.Rollout`;
        a hookimpl may adjust ``rollout.reward`` in place (reward shaping, penalties): the trainer sees the
        adjusted values.
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def on_step_end(run: RunView, step: int, metrics: dict[str, Any]) -> None:
    """A step finished.

    Called every step, after training, the step's evolution and its record in the event log, before the step's
    probe and checkpoint.

    :param run: the run as hooks see it (``steps_done`` is ``step``).
    :param step: the step that finished, 1-based.
    :param metrics: the flat dict of the step's metrics, also written to the event log and the sinks.
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def before_evolution(run: RunView, step: int, population: Population) -> None:
    """Selection and replacement are about to run.

    Called every ``evolution.every`` steps (never in a single-agent run, nor at a run's last step: a run extended
    past it evolves at the start of the next step), before the selector runs.

    :param run: the run as hooks see it.
    :param step: the step the evolution belongs to, 1-based.
    :param population: ``run.population``: a copy of the members as selection will see them (roles, versions,
        ``rating``, ``counters.matches``, ``born_step``, lineage); changing it changes nothing in the run, as for
        every lifecycle hook's ``run``.
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def after_evolution(run: RunView, step: int, events: list[dict[str, Any]]) -> None:
    """Children were born.

    Called after every ``before_evolution``, once the children's lineage is written to ``lineage.jsonl``.

    :param run: the run as hooks see it (its population holds the children).
    :param step: the step the evolution belongs to, 1-based.
    :param events: the lineage records of the children, one per child (``member``, ``parents``, ``operator``,
        ``params``, ``seed``, ...); empty when selection replaced no member.
    :returns: nothing; a returned value is ignored.
    """


@hookspec
def on_checkpoint(run: RunView, step: int, path: str) -> None:
    """A complete checkpoint was written.

    Called after every checkpoint (every ``checkpoint.every`` steps, at the last step, and on a stop signal),
    before the adapter versions it no longer needs are pruned.

    :param run: the run as hooks see it.
    :param step: the step whose state the checkpoint holds.
    :param path: the checkpoint's directory, written atomically and complete.
    :returns: nothing; a returned value is ignored.
    """
