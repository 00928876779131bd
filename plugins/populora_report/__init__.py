"""``populora report``: the paper's figures for one or several runs side by side, as PNGs and one
self-contained HTML page (images embedded as data URIs, so the single file can be mailed around);
and the summary every completed run prints and writes to ``summary.json``, so a run tells its result.

Reads only the run directory's logs (recipe.yaml, events.jsonl, lineage.jsonl, members.json,
tasks/problems.jsonl, probe.jsonl); matplotlib is imported only when a report is rendered.
"""

from __future__ import annotations

import time
from pathlib import Path

from populora_core.api import hookimpl

_started: dict[Path, float] = {}  # run directory -> perf_counter at on_run_start


@hookimpl
def register_commands(cli):
    import click

    @cli.command()
    @click.argument("run_dirs", nargs=-1, required=True, type=click.Path())
    @click.option(
        "--out",
        type=click.Path(file_okay=False),
        default=None,
        help="Output directory (default RUN_DIR/report for one run, ./report for several).",
    )
    def report(run_dirs: tuple[str, ...], out: str | None) -> None:
        """Render figures and a self-contained HTML page of one run, or of several side by side.

        \b
          populora report runs/nano
          populora report runs/study/population-seed* runs/study/baseline-seed* --out report-study
        """
        from .render import render_report

        click.echo(str(render_report(list(run_dirs), out)))


@hookimpl
def on_run_start(run):
    _started[run.run_dir] = time.perf_counter()


@hookimpl
def on_run_end(run, status):
    """A completed run prints its summary table and writes summary.json; a failed one leaves its error alone."""
    start = _started.pop(run.run_dir, None)
    if status != "completed":
        return
    import click

    from .summary import format_summary, write_summary

    summary = write_summary(run.run_dir, wall_s=None if start is None else time.perf_counter() - start)
    click.echo(format_summary(summary))
