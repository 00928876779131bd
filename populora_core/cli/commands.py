"""The ``populora`` command line. Imports nothing heavy: ``--help`` and ``plugins`` answer fast."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import click

from .. import __version__
from ..api.errors import UserError
from ..plugin.manager import get_manager
from . import tools as cli_tools
from .group import PopuloraGroup, RecipeCommand, plugin_options_first, warning_line
from .tools import complete_override, complete_recipe


@click.group(cls=PopuloraGroup)
@click.version_option(__version__, prog_name="populora")
@click.option(
    "--plugin",
    "plugin_files",
    multiple=True,
    type=click.Path(),
    help="Load a local plugin file for this run (repeatable).",
)
@click.pass_context
def cli(ctx: click.Context, plugin_files: tuple[str, ...]) -> None:
    """PopuLoRA: population-based LoRA self-play on one frozen base model."""
    ctx.obj = get_manager(plugin_files)


def _load_recipe(manager: Any, recipe: str, overrides: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
    from ..recipe.validate import load_recipe

    return load_recipe(recipe, list(overrides), manager.registry)


def _check_files(model: Any, recipe: str, overrides: tuple[str, ...]) -> None:
    """The files the recipe names (an error, exit 2, before anything is written) and those only eval reads (a
    warning)."""
    from ..recipe.validate import check_files
    from ..run.loop import check_start

    warnings = check_files(model, recipe, overrides)
    check_start(model, recipe)  # and init_from's adapters for each role
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


def _apply_runtime(section: Any) -> None:
    """The recipe's CPU kernel paths (``runtime.cpu_isa``) and the CUDA allocator's default (expandable segments)
    into the environment, before anything imports torch. ``runtime.threads`` is ``start_run``'s and
    ``resume_run``'s to apply (a run from Python gets it too); ``populora seed``, which starts no run, applies it
    itself."""
    from ..services.runtime import apply_cpu_isa, default_allocator

    apply_cpu_isa(section)
    default_allocator()


@cli.command(cls=RecipeCommand)
@click.argument("recipe", type=click.Path(), shell_complete=complete_recipe)
@click.argument("overrides", nargs=-1, shell_complete=complete_override)
@click.option("--run-dir", type=click.Path(), help="Run directory (default runs/<recipe name>).")
@click.option("--progress/--no-progress", default=None, help="Live display (default: on a TTY).")
@click.option("--dry-run", is_flag=True, help="Print the resolved recipe and its plan; run nothing, write nothing.")
@click.option(
    "--init-from",
    type=click.Path(),
    help="Start from existing adapters: a run directory or a folder of PEFT folders (population.init_from).",
)
@click.pass_obj
def run(
    manager: Any,
    recipe: str,
    overrides: tuple[str, ...],
    run_dir: str | None,
    progress: bool | None,
    dry_run: bool,
    init_from: str | None,
) -> None:
    """Run a recipe: populora run RECIPE [key.sub=value ...].

    \b
    Overrides are YAML values at dotted paths; list items by index:
      populora run recipes/nano.yaml seed=1 steps=12 --run-dir runs/nano-s1
      populora run recipes/nano.yaml evolution.operators.0.name=svd trainer.params.lr=1.0e-3
      populora run recipes/azr_7b.yaml --dry-run     # the recipe as it would run, and whether it fits
      populora run recipes/nano.yaml --init-from runs/nano-single --run-dir runs/nano-warm
    Ctrl-C stops it; `populora resume RUN_DIR` continues from its last checkpoint. SIGTERM or SIGUSR1 (a
    scheduler's stop) first checkpoints the newest complete step, then exits 143.
    """
    if init_from is not None:
        overrides = (*overrides, f"population.init_from={init_from}")
    model, resolved = _load_recipe(manager, recipe, overrides)
    _check_files(model, recipe, overrides)
    if dry_run:
        _warn_short_run(model)
        _dry_run(manager, recipe, model, run_dir)
        return
    _apply_runtime(model.runtime)
    from ..run.loop import start_run
    from ..run.run_dir import RunDir
    from ..services.device import resolve_device

    directory = RunDir(run_dir or f"runs/{model.name}")
    startup = (
        f"populora run {recipe} -> {directory.path} ({model.name}, seed {model.seed}, {model.steps} steps, "
        f"{resolve_device()})"
    )
    click.echo(startup, err=True)
    run_obj = start_run(model, resolved, directory, manager, recipe_file=recipe)
    directory.log_line(startup)
    directory.log_line(run_obj.sources)
    short = _warn_short_run(model)  # once the run has started: a failed start says only why it failed
    if short:
        directory.log_line(f"warning: {short}")
    _execute(run_obj, directory, progress)


def _warn_short_run(model: Any) -> str | None:
    """Say on stderr when the recipe's steps leave evolution no chance to make a child; returns the warning."""
    from ..recipe.validate import evolution_warning

    warning = evolution_warning(model)
    if warning:
        click.echo(f"warning: {warning}", err=True)
    return warning


def _dry_run(manager: Any, recipe: str, model: Any, run_dir: str | None) -> None:
    """The resolved recipe (every default filled in, as ``recipe.yaml`` of the run would hold it) and the plan."""
    import yaml

    from ..run.plan import gpu_budget, plan_loaded
    from .plan_view import format_plan

    click.echo(f"# populora run {recipe} -> {run_dir or f'runs/{model.name}'} (dry run: nothing runs or is written)")
    click.echo(yaml.safe_dump(model.model_dump(mode="json"), sort_keys=False).rstrip())
    from ..services.device import resolve_device

    engine_device = str(model.engine.params.get("device", "auto"))
    try:
        planned = format_plan(plan_loaded(model, manager.registry, recipe, *gpu_budget(None)))
    except UserError as exc:  # no model config at hand (an uncached hub model): the recipe is still valid
        planned = f"no plan: {exc}"
    if resolve_device(engine_device) == "cpu":  # GPU memory terms would describe a machine this run does not use
        disk = [line for line in planned.splitlines() if line.startswith("disk:")]
        planned = "\n".join(
            [
                "runs on the CPU here (no GPU is visible, or the engine's device is cpu): no GPU memory to plan; "
                f"`populora plan {recipe} --gpu-memory 80GiB` plans it for a GPU",
                *disk,
            ]
        )
    click.echo("\n# plan (populora plan)\n" + "\n".join(f"# {line}" if line else "#" for line in planned.splitlines()))


def _execute(run_obj: Any, directory: Any, progress: bool | None) -> None:
    """The steps with the live display, each line also in ``RUN/run.log``; Ctrl-C ends with the command that
    continues the run (exit 130), SIGTERM or SIGUSR1 with a checkpoint of the newest complete step and that command
    (exit 143)."""
    from ..run.stop import EXIT_CODE, StopRequested
    from .progress import execute_with_progress

    try:
        execute_with_progress(run_obj, progress=progress)
    except StopRequested as stop:
        stopped = _stopped_line(stop, directory)
        directory.log_line(stopped)
        click.echo(f"\n{stopped}", err=True)
        sys.exit(EXIT_CODE)
    except KeyboardInterrupt:
        if directory.checkpointed_step() > 0:
            stopped = (
                f"interrupted after step {run_obj.step}: `populora resume {directory.path}` continues from its last "
                "checkpoint"
            )
        else:  # no checkpoint yet: there is nothing to continue from, say so rather than promise one
            stopped = (
                f"interrupted after step {run_obj.step}, before the first checkpoint: nothing to continue from; "
                f"`populora resume {directory.path}` starts the run over"
            )
        directory.log_line(stopped)
        click.echo(f"\n{stopped}", err=True)
        sys.exit(130)
    except Exception as exc:
        from ..services.files import is_disk_full

        directory.log_line(f"failed after step {run_obj.step}: {type(exc).__name__}: {exc}")
        if not isinstance(exc, UserError) and is_disk_full(exc, directory.path):
            where = getattr(exc, "filename", None) or directory.path
            raise UserError(
                f"no space left on the device of {where} after step {run_obj.step} ({exc}); the newest checkpoint "
                f"is intact: free space there, then `populora resume {directory.path}`"
            ) from None
        raise
    directory.log_line("run complete")
    click.echo(f"run complete: {directory.path}")


def _stopped_line(stop: Any, directory: Any) -> str:
    """What a stop kept, and the command that continues the run."""
    if stop.in_step is not None:
        where = f"in step {stop.in_step} (before it trained; that step is redone)"
    elif stop.finished_step:
        where = "after finishing the step in progress (checkpoint.stop_grace_s)"
    else:
        where = "after the step in progress finished (it was training or checkpointing)"
    if stop.checkpoint_step is None:
        return (
            f"stopped by {stop.signal_name} {where}, before any step completed: nothing to keep; "
            f"`populora resume {directory.path}` starts the run over"
        )
    return (
        f"stopped by {stop.signal_name} {where}: checkpoint of step {stop.checkpoint_step} kept; "
        f"`populora resume {directory.path}` continues from it"
    )


@cli.command(cls=RecipeCommand)
@click.argument("recipe", type=click.Path(), shell_complete=complete_recipe)
@click.argument("overrides", nargs=-1, shell_complete=complete_override)
@click.option("--out", type=click.Path(), required=True, help="JSONL file to write (Problem records).")
@click.option("--per-type", type=int, default=256, show_default=True, help="Valid seeds per task type (AZR: 256).")
@click.option("--max-rounds", type=int, default=40, show_default=True, help="Give up after this many rounds.")
@click.pass_obj
def seed(manager: Any, recipe: str, overrides: tuple[str, ...], out: str, per_type: int, max_rounds: int) -> None:
    """AZR's seeding stage: the recipe's base model proposes seed problems for its tasks (no training).

    Recipes load the file with seeds.enabled=true seeds.file=OUT.

    \b
      populora seed recipes/azr_7b.yaml --out seeds/qwen7b.jsonl --per-type 256
      populora run recipes/azr_7b.yaml seeds.enabled=true seeds.file=seeds/qwen7b.jsonl
    """
    import tempfile

    model, _ = _load_recipe(manager, recipe, overrides)
    _apply_runtime(model.runtime)
    from ..services.runtime import apply_threads

    apply_threads(model.runtime)  # before torch loads: no run applies it for this command
    from ..run.assembly import build_components
    from ..run.run_dir import RunDir
    from ..run.seeding import make_seed_problems
    from ..services.problems import write_problems

    def report(round_: int, counts: dict[str, int]) -> None:
        done = ", ".join(f"{name} {count}/{per_type}" for name, count in counts.items())
        click.echo(f"round {round_}: {done}", err=True)

    with tempfile.TemporaryDirectory(prefix="populora-seed-") as tmp:
        components = build_components(model, RunDir(tmp), manager)
        try:
            problems = make_seed_problems(components, per_type, max_rounds=max_rounds, on_round=report)
        finally:
            components.close()
    click.echo(f"{len(problems)} seed problems written to {write_problems(problems, out)}")


@cli.command(cls=RecipeCommand)
@click.argument("run_dir", type=click.Path())
@click.argument("overrides", nargs=-1)
@click.option("--progress/--no-progress", default=None, help="Live display (default: on a TTY).")
@click.pass_obj
def resume(manager: Any, run_dir: str, overrides: tuple[str, ...], progress: bool | None) -> None:
    """Continue a run from its last complete checkpoint (one killed before its first starts over).

    OVERRIDES: 'cluster=ray cluster.params.workers=4' (or 'cluster=local') continue it on other hardware with the
    same result; 'steps=N' extends a run (a finished one too) to N steps, computing what a run planned for N
    steps does after its last step. Nothing else may change.

    \b
      populora resume runs/nano
      populora resume runs/nano steps=64             # 32 more steps
      populora resume runs/azr-7b cluster=ray cluster.params.workers=4
    """
    from ..recipe.overrides import apply_overrides
    from ..recipe.validate import parse_recipe
    from ..run.loop import check_resume_overrides, check_resume_steps
    from ..run.recovery import recipe_for_resume, resume_point
    from ..run.run_dir import RunDir

    check_resume_overrides(overrides)
    directory = RunDir(run_dir)
    recipe_file = str(directory.path / "recipe.yaml")
    if not directory.path.is_dir():
        raise UserError(f"{run_dir} is not a run directory (no such folder); `populora runs` lists the runs")
    point = resume_point(directory)
    recorded = parse_recipe(
        apply_overrides(recipe_for_resume(directory), list(overrides), recipe=recipe_file), None, recipe=recipe_file
    )
    done = point.step
    check_resume_steps(recorded.steps, done)
    if done == recorded.steps:  # resuming would only rewrite its summary (wall time 0 s): the record stays as it is
        click.echo(f"{run_dir} already finished at step {done} (its summary.json is its record); nothing to do")
        return
    _apply_runtime(recorded.runtime)
    from ..run.loop import resume_run

    run_obj = resume_run(directory, manager, overrides)
    for note in directory.notes:  # damage found and what was done about it
        click.echo(f"warning: {note}", err=True)
        directory.log_line(f"warning: {note}")
    resuming = f"resuming {run_dir} at step {run_obj.step}"
    click.echo(resuming, err=True)
    directory.log_line(resuming + (f" ({' '.join(overrides)})" if overrides else ""))
    directory.log_line(run_obj.sources)
    _execute(run_obj, directory, progress)


@cli.command(cls=RecipeCommand)
@click.argument("recipe", type=click.Path(), shell_complete=complete_recipe)
@click.argument("overrides", nargs=-1, shell_complete=complete_override)
@click.pass_obj
def validate(manager: Any, recipe: str, overrides: tuple[str, ...]) -> None:
    """Validate a recipe (structure, then every component's params) without running it, and print its
    rollout budget per slot and step: what a compute-matched single-agent baseline must equal.

    A slot is one adapter (a population has teachers + students of them; a single agent has 'teachers',
    each playing both roles). Per step, for the whole run: proposals = teachers x proposals_per_teacher x
    task types; solver samples <= proposals x solver_samples (only valid proposals are solved); buffer
    solves = students x buffer_problems_per_student x task types; trained rollouts <= proposals + buffer
    solves (+ solver samples with train_on_estimation); generated tokens <= proposals x propose_max_tokens
    + (solver samples + buffer solves) x solve_max_tokens. Each is divided by the number of slots.

    \b
      populora validate recipes/azr_7b.yaml
      populora validate recipes/nano.yaml population.teachers=4 population.students=4
    """
    from fractions import Fraction

    model, _ = _load_recipe(manager, recipe, overrides)
    _check_files(model, recipe, overrides)
    pop, ro = model.population, model.rollout
    click.echo(
        f"{recipe}: ok ({model.name}, {pop.teachers}T-{pop.students}S "
        f"{pop.mode}, {len(model.component_refs())} components)"
    )
    _warn_short_run(model)
    slots = pop.adapters
    proposals = pop.teachers * ro.proposals_per_teacher * len(model.tasks)
    samples = proposals * ro.solver_samples
    buffer = pop.students * ro.buffer_problems_per_student * len(model.tasks)
    trained = proposals + buffer + (samples if ro.train_on_estimation else 0)
    tokens = proposals * ro.propose_max_tokens + (samples + buffer) * ro.solve_max_tokens

    def per_slot(total: int) -> str:
        share = Fraction(total, slots)
        return f"{share.numerator:,}" if share.denominator == 1 else f"{float(share):,.1f}"

    both = "1 adapter in both roles" if slots == 1 else f"{slots} adapters, each in both roles"
    who = both if pop.single_agent else f"{pop.teachers}T + {pop.students}S adapters"
    click.echo(
        f"  per slot and step: {per_slot(proposals)} proposals, <= {per_slot(samples)} solver samples, "
        f"{per_slot(buffer)} buffer solves; <= {per_slot(trained)} trained rollouts, "
        f"<= {per_slot(tokens)} generated tokens; slots: {slots} ({who})"
    )


for _command in cli_tools.COMMANDS:  # the verbs that inspect (cli_tools imports nothing from here)
    cli.add_command(_command)


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the libraries' own bars (transformers' "Loading weights", hub downloads) would interleave with the run's
    # display and fill logs; the run shows its own progress
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.formatwarning = warning_line
    cli(args=plugin_options_first(sys.argv[1:]), prog_name="populora")


if __name__ == "__main__":
    main()
