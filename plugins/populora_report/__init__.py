"""``populora report``: the paper's figures for one or several runs side by side, as PNGs and one
self-contained HTML page (images embedded as data URIs, so the single file can be mailed around).

Reads only the run directory's logs (recipe.yaml, events.jsonl, lineage.jsonl, members.json,
tasks/problems.jsonl, probe.jsonl); matplotlib is imported only when a report is rendered.
"""

from __future__ import annotations

from populora_core import hookimpl


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
        """Render figures and a self-contained HTML page: populora report RUN_DIR [RUN_DIR ...]."""
        from .render import render_report

        click.echo(str(render_report(list(run_dirs), out)))
