"""The ``populora`` commands that inspect rather than run: plugins, keys, plan, doctor, runs, export, completion,
recipe-schema, recipes. :mod:`populora_core.cli.commands` adds :data:`COMMANDS` to its group; nothing heavy at
import."""

from __future__ import annotations

import difflib
import json
import sys
from typing import Any

import click

from ..api.errors import UserError


def complete_override(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of ``key.sub=value`` overrides: the recipe's keys (components' params: ``populora keys``)."""
    from ..api.schema import Recipe
    from ..recipe.keys import model_keys

    return [key for key, *_ in model_keys(Recipe) if key.startswith(incomplete)] if "=" not in incomplete else []


def complete_recipe(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Shell completion of a RECIPE: the shipped recipes' names, then files (the shell completes those)."""
    from click.shell_completion import CompletionItem

    from ..recipe.shipped import shipped_recipes

    names = [CompletionItem(name) for name in shipped_recipes() if name.startswith(incomplete)]
    return [*names, CompletionItem(incomplete, type="file")]


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script (commands, options, recipe keys after a recipe).

    \b
      echo 'eval "$(populora completion bash)"' >> ~/.bashrc
      echo 'eval "$(populora completion zsh)"' >> ~/.zshrc
      populora completion fish > ~/.config/fish/completions/populora.fish
    """
    from click.shell_completion import get_completion_class

    completer = get_completion_class(shell)
    assert completer is not None  # click ships all three
    root = click.get_current_context().find_root().command  # the populora group this verb is part of
    click.echo(completer(root, {}, "populora", "_POPULORA_COMPLETE").source())


def _arity(component: Any) -> dict[str, Any]:
    """An operator's registered arity (``min_parents``, ``max_parents``, as text), or what is wrong with it."""
    from ..api.errors import PluginError
    from ..api.operators import arity_text, operator_arity

    try:
        low, high = operator_arity(component)
    except PluginError as exc:
        return {"min_parents": None, "max_parents": None, "text": f"(not usable: {exc})"}
    return {"min_parents": low, "max_parents": high, "text": arity_text(component)}


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def plugins(manager: Any, as_json: bool) -> None:
    """List installed plugins, their hooks, components (each operator's parents as it registered them) and load
    errors.

    \b
      populora plugins
      populora --plugin my_reward.py plugins --json
    """
    by_plugin: dict[str, list[str]] = {}
    parents: dict[str, dict[str, dict[str, Any]]] = {}  # plugin -> operator -> its registered arity
    for comp in manager.registry:
        by_plugin.setdefault(comp.plugin, []).append(f"{comp.kind}:{comp.name}")
        if comp.kind == "operator":
            parents.setdefault(comp.plugin, {})[comp.name] = _arity(comp)
    rows = [
        {
            "name": p.name,
            "source": p.source,
            "version": p.version,
            "hooks": p.hooks,
            "components": by_plugin.get(p.name, []),
            "operator_parents": parents.get(p.name, {}),
            "error": p.error,
        }
        for p in sorted(manager.plugins.values(), key=lambda p: p.name)
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        status = click.style("FAILED", fg="red") if row["error"] else click.style("ok", fg="green")
        click.echo(f"{row['name']} ({row['source']} {row['version']}) {status}")
        if row["error"]:
            click.echo(f"    error: {row['error']}")
        if row["components"]:
            click.echo(f"    components: {', '.join(row['components'])}")
        if row["operator_parents"]:
            arities = (f"{name} {arity['text']}" for name, arity in row["operator_parents"].items())
            click.echo(f"    operator parents: {', '.join(arities)}")
        if row["hooks"]:
            click.echo(f"    hooks: {', '.join(row['hooks'])}")


@click.command()
@click.argument("recipe", type=click.Path(), shell_complete=complete_recipe)
@click.argument("overrides", nargs=-1, shell_complete=complete_override)
@click.option(
    "--gpus", type=int, help="GPUs; members are split over them (default: what the recipe's cluster reserves, else 1)."
)
@click.option("--gpu-memory", help="Memory per GPU, e.g. 80GiB, 141GiB, 80GB (default: the visible GPU, else 80GiB).")
@click.option("--config", "config_path", type=click.Path(), help="The base model's config.json (no weights needed).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def plan(
    manager: Any,
    recipe: str,
    overrides: tuple[str, ...],
    gpus: int | None,
    gpu_memory: str | None,
    config_path: str | None,
    as_json: bool,
) -> None:
    """Will a recipe fit? GPU memory per device (base copies, vLLM, trainer) and disk, from the model config.

    Exit 0 when it fits, 1 when it does not (the verdict says by how much and what to try).

    \b
      populora plan recipes/azr_7b.yaml --gpu-memory 80GiB
      populora plan recipes/azr_7b.yaml --gpus 8 --gpu-memory 141GiB --json
    """
    from ..run.plan import plan_file
    from .plan_view import does_not_fit, format_plan

    result = plan_file(recipe, overrides, manager, gpus=gpus, gpu_memory=gpu_memory, config=config_path)
    click.echo(json.dumps(result, indent=2) if as_json else format_plan(result))
    if does_not_fit(result):
        sys.exit(1)


@click.command()
@click.argument("run_dir", type=click.Path())
@click.argument("member")
@click.option("--out", type=click.Path(), required=True, help="A new (or empty) folder to write.")
@click.option("--merge", is_flag=True, help="A full model: the base with the adapter merged in, and its tokenizer.")
@click.pass_obj
def export(manager: Any, run_dir: str, member: str, out: str, merge: bool) -> None:
    """Export a member of a run: a PEFT adapter folder with a card (lineage, rating, probe), or --merge'd.

    MEMBER is a member id (its current version) or a version (s0@v3).

    \b
      populora export runs/nano s0 --out exports/s0
      populora export runs/nano s1@v8 --out exports/s1-merged --merge
    """
    import signal

    from .export import export as export_member

    def stop(signum: int, frame: Any) -> None:  # SIGTERM and SIGHUP end the write as Ctrl-C does: no hidden folder
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        written = export_member(
            run_dir,
            member,
            out,
            merge=merge,
            registry=manager.registry,
            manager=manager,
            note=lambda text: click.echo(text, err=True),
        )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    click.echo(str(written))


@click.command()
@click.argument("directory", required=False, default="runs", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def runs(directory: str, as_json: bool) -> None:
    """The runs under DIRECTORY (default runs/): recipe, seed, checkpointed steps of planned, status, best - base.

    \b
      populora runs
      populora runs /scratch/study --json
    Status: running (its process holds the run's lock), finished, stopped (`populora resume` continues it),
    damaged (a checkpoint is damaged: the step a resume goes on from, or that none can; `populora resume` sets the
    damage aside in RUN/damaged/), or unreadable (its recipe.yaml does not parse; the reason is shown).
    """
    from pathlib import Path

    from ..run.listing import list_runs

    if not Path(directory).is_dir():
        raise UserError(f"{directory}: no such directory (runs go to runs/<recipe name> unless --run-dir says)")
    rows = list_runs(directory)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no runs under {directory}")
        return

    def gain(row: dict[str, Any]) -> str:
        value, interval = row["best_minus_base"], row["best_minus_base_interval"]
        if value is None:
            return "-"
        text = f"{100 * value:+.1f}"
        return text + (f" [{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]" if interval else "")

    table = [("run", "recipe", "seed", "steps", "status", "best - base (points)")] + [
        (r["path"], str(r["recipe"]), str(r["seed"]), _steps(r), r["status"], gain(r)) for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def _steps(row: dict[str, Any]) -> str:
    """``done/planned``; ``-`` for a run whose recipe cannot be read."""
    return "-" if row["steps"] is None else f"{row['steps_done']}/{row['steps']}"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def doctor(manager: Any, as_json: bool) -> None:
    """Installed torch/CUDA/driver/vLLM/triton/flash-attn, GPUs and free memory, whether the sandbox's system-call
    filter is active; exit 1 on a broken combination.

    \b
      populora doctor
      populora doctor --json
    """
    from .doctor import check_components, diagnose, format_report, report_json

    report = diagnose()
    check_components(report, manager.registry)
    click.echo(report_json(report) if as_json else format_report(report))
    if not report.ok:
        sys.exit(1)


@click.command()
@click.argument("what", required=False)
@click.option("--markdown", is_flag=True, help="The whole reference as one Markdown page (docs/recipe-keys.md).")
@click.pass_obj
def keys(manager: Any, what: str | None, markdown: bool) -> None:
    """Every recipe key with its type, default and description; or one section's, or one component's params.

    \b
      populora keys                 the recipe's sections and keys
      populora keys rollout         one section
      populora keys trainer         the trainers there are, then each one's params
      populora keys trr++           one component's params (trainer.params.*)
      populora keys --markdown      everything as one Markdown page
    """
    from ..api.errors import UserError
    from ..api.schema import Recipe
    from ..recipe.keys import COMPONENT_SECTIONS, model_keys, reference_markdown

    def table(rows: list[tuple[str, str, str, str]]) -> None:
        width = max((len(r[0]) for r in rows), default=0)
        for key, kind, default, description in rows:
            click.echo(
                f"{key:<{width}}  {kind}  default {default}"
                + (f"\n{'':<{width}}  {description}" if description else "")
            )

    registry = manager.registry
    if markdown:
        if what is not None:
            raise UserError(f"keys: --markdown prints the whole reference; leave out {what!r}")
        click.echo(reference_markdown(registry), nl=False)
        return
    rows = model_keys(Recipe)
    if what is None:
        table(rows)
        click.echo(f"\ncomponents: `populora keys SECTION` for {', '.join(COMPONENT_SECTIONS)}")
        return
    section = [r for r in rows if r[0] == what or r[0].startswith(f"{what}.")]
    components = [c for c in registry if c.name == what]
    if what in COMPONENT_SECTIONS:
        components = [c for c in registry if c.kind == COMPONENT_SECTIONS[what]]
    if not section and not components:
        near = difflib.get_close_matches(what, [r[0].split(".")[0] for r in rows] + [c.name for c in registry], n=1)
        raise UserError(f"keys: no section or component {what!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
    if section and what not in COMPONENT_SECTIONS:
        table(section)
    for component in components:
        click.echo(f"\n{component.kind} {component.name} (plugin {component.plugin}): {component.description}")
        table(model_keys(component.params_model, "params."))


@click.command("recipe-schema")
@click.pass_obj
def recipe_schema(manager: Any) -> None:
    """Print the JSON Schema of a recipe, including every installed plugin's params.

    \b
      populora recipe-schema > populora.schema.json   # editors validate recipes against it
    """
    from ..recipe.keys import recipe_json_schema

    click.echo(json.dumps(recipe_json_schema(manager.registry), indent=2))


#: the inspecting verbs, added to the ``populora`` group by :mod:`populora_core.cli.commands`
@click.group(invoke_without_command=True)
@click.pass_context
def recipes(ctx: click.Context) -> None:
    """The recipes this package ships, one line each; each runs by name from any folder (populora run nano).

    \b
      populora recipes                      # the list
      populora recipes show azr_7b          # one recipe, as shipped
      populora recipes copy nano my.yaml    # an editable copy: populora run my.yaml
    """
    if ctx.invoked_subcommand is not None:
        return
    from ..recipe.shipped import shipped_recipes, summary

    shipped = shipped_recipes()
    width = max((len(name) for name in shipped), default=0)
    for name, path in shipped.items():
        click.echo(f"{name:<{width}}  {summary(path)}")


@recipes.command("show")
@click.argument("name")
def recipes_show(name: str) -> None:
    """Print the shipped recipe NAME as it ships."""
    from ..recipe.shipped import shipped_recipe

    click.echo(shipped_recipe(name).read_text(), nl=False)


@recipes.command("copy")
@click.argument("name")
@click.argument("path", required=False, type=click.Path())
@click.option("--force", is_flag=True, help="Overwrite PATH if it exists.")
def recipes_copy(name: str, path: str | None, force: bool) -> None:
    """Write an editable copy of the shipped recipe NAME to PATH (default ./NAME.yaml; a folder: NAME.yaml in it)."""
    from pathlib import Path

    from ..recipe.shipped import shipped_recipe

    source = shipped_recipe(name)
    target = Path(path) if path else Path(source.name)
    if target.is_dir():
        target = target / source.name
    if target.exists() and not force:
        raise UserError(f"{target} exists; choose another PATH or pass --force to overwrite it")
    if not target.parent.is_dir():
        raise UserError(f"{target.parent} is not a folder; create it first or choose another PATH")
    target.write_text(source.read_text())
    click.echo(f"wrote {target} (the shipped {source.stem}); run it with: populora run {target}")


@click.command("convert-checkpoints")
@click.argument("run_dir", type=click.Path())
def convert_checkpoints(run_dir: str) -> None:
    """Convert a run written by an older version (pickled task state) once, so that it resumes.

    Each checkpoint's tasks/<name>.pkl becomes tasks/<name>.json (and its manifest entry), read as plain data
    only: a pickle that names any class or function is refused and nothing of its checkpoint changes.

    \b
      populora convert-checkpoints runs/nano && populora resume runs/nano
    """
    from pathlib import Path

    from ..run.state import convert_checkpoints as convert

    done = convert(Path(run_dir))
    click.echo(
        f"converted {len(done)} task state file(s) of {run_dir} to JSON" if done else f"{run_dir}: nothing to convert"
    )


COMMANDS = [completion, plugins, plan, export, runs, doctor, keys, recipe_schema, recipes, convert_checkpoints]
