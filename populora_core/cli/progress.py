"""The live display of ``populora run`` / ``resume``: a progress bar on a terminal, one line per step elsewhere."""

from __future__ import annotations

import sys
from typing import Any

from ..run.loop import Run, execute


def execute_with_progress(run: Run, *, progress: bool | None = None) -> None:
    """:func:`execute` the run, showing each step's solve rate, validity, children and time."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    console = Console(stderr=True)
    show = console.is_terminal if progress is None else progress
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns, console=console, disable=not show) as bar:
        task = bar.add_task(run.recipe.name, total=run.recipe.steps, completed=run.step, info="")

        def on_probe() -> None:
            bar.update(task, info="probe evaluation of the base and the initial students")
            run.dir.log_line("probe evaluation of the base and the initial students")

        def on_step(m: dict[str, Any]) -> None:
            info = (
                f"solve {_fmt(m.get('solve_rate'))} valid {_fmt(m.get('validity'))} "
                f"children {m.get('evolution/children', 0)} {m['time/step']:.1f}s/step"
            )
            bar.update(task, completed=run.step, info=info)
            line = f"step {run.step}/{run.recipe.steps} {info}"
            run.dir.log_line(line)
            if not show:
                print(f"[{run.recipe.name}] {line}", file=sys.stderr, flush=True)

        # the bar ends before on_run_end observers print (the report plugin's summary): else it is redrawn below
        def note(text: str) -> None:  # what a stop signal does, above the bar
            console.print(text, markup=False, highlight=False)

        execute(run, on_step=on_step, on_probe=on_probe, on_steps_done=bar.stop, note=note)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
