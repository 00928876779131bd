"""The difficulty figures, drawn only for a task that declares ``difficulty_levels``: teachers' mean proposal level,
and students' solve rate per level."""

from __future__ import annotations

from pathlib import Path

from ..data import RunData
from . import canvas


def _scope_title(scope: str) -> str:
    return f" ({scope.rstrip('/')})" if scope else ""


def difficulty(runs: list[RunData], out_dir: Path) -> canvas.FigureOut | None:
    """Each teacher's mean proposal difficulty per step; no figure when no run's task declares levels."""
    scopes = list(dict.fromkeys(scope for run in runs for scope in run.difficulty_scopes()))
    if not scopes:
        (out_dir / "difficulty.png").unlink(missing_ok=True)  # a report rendered again keeps no other run's figure
        return None
    fig, axes = canvas.figure(len(scopes), len(runs), 4.6, 3.2)
    notes = []
    for col, run in enumerate(runs):
        colors = canvas.member_colors(run)
        for row, scope in enumerate(scopes):
            ax = axes[row][col]
            ax.set_title(run.label + _scope_title(scope), fontsize=10)
            drawn = canvas.plot_members(ax, run, run.teachers(), f"{scope}difficulty", colors)
            xs, ys = run.series(f"teacher/{scope}difficulty")
            if xs:
                ax.plot(xs, canvas.smooth(ys, run.final_step), color="black", lw=2.2, label="all teachers")
            if not drawn and not xs:
                canvas.empty(ax, "no difficulty logged (its tasks declare no levels)")
                notes.append(f"{run.label}: no proposal difficulty{_scope_title(scope)} in events.jsonl")
                continue
            levels = sorted({lv for found in run.level_members(scope).values() for lv in found})
            if levels:  # the declared range, so a rise reads against how far it could go
                ax.set_ylim(levels[0] - 0.3, levels[-1] + 0.3)
            ax.set_xlabel("step")
            ax.set_ylabel("mean difficulty (level)\nof valid proposals")
            ax.grid(alpha=0.3)
            canvas.legend(ax, run, outside=True)
    fig.suptitle("Teachers' proposal difficulty over time")
    canvas.save(fig, out_dir, "difficulty.png")
    return canvas.FigureOut(
        "fig-difficulty",
        "difficulty.png",
        "Teachers' proposal difficulty over time",
        "Mean difficulty (the task's level) of the valid proposals each teacher wrote per step (thin; a child's "
        "line starts at its birth), and of all teachers' (black). Teachers rewarded by their students' failures "
        "should push it up; a single agent calibrates to what it can solve. "
        f"Runs longer than {canvas.SMOOTH_ABOVE} steps are smoothed with a trailing mean over 1/15 of the run.",
        "Line chart: mean proposal difficulty per teacher and step, one panel per run",
        notes,
    )


def solve_rate_by_level(runs: list[RunData], out_dir: Path) -> canvas.FigureOut | None:
    """Each student's solve rate per difficulty level per step, levels as colours; no figure without levels."""
    from matplotlib import colormaps

    panels = [
        [
            (scope, member, levels)
            for scope in run.difficulty_scopes()
            for member, levels in run.level_members(scope).items()
        ]
        for run in runs
    ]
    if not any(panels):
        (out_dir / "solve_rate_by_level.png").unlink(missing_ok=True)
        return None
    all_levels = sorted({lv for mine in panels for _, _, levels in mine for lv in levels})
    cmap = colormaps["viridis"]
    color = {lv: cmap(i / max(len(all_levels) - 1, 1) * 0.9) for i, lv in enumerate(all_levels)}  # no pale yellow
    fig, axes = canvas.figure(max(map(len, panels)), len(runs), 4.6, 2.6)
    notes = []
    for col, (run, mine) in enumerate(zip(runs, panels)):
        if not mine:
            canvas.empty(axes[0][col], "no solve rates per level logged (its tasks declare no levels)")
            axes[0][col].set_title(run.label, fontsize=10)
            notes.append(f"{run.label}: no solve rates per level in events.jsonl")
        for row, (scope, member, levels) in enumerate(mine):
            ax = axes[row][col]
            ax.set_title(f"{run.label}: {member}{_scope_title(scope)}", fontsize=10)
            drawn = False
            for level in levels:
                xs, ys = run.member_series(member, f"{scope}solve_rate_at_level/{level}")
                if xs:
                    ax.plot(
                        xs,
                        canvas.smooth(ys, run.final_step),
                        color=color[level],
                        lw=1.2,
                        marker=canvas.marker(len(xs)),
                        ms=3,
                        label=f"level {level}",
                    )
                    drawn = True
            if not drawn:
                canvas.empty(ax, f"{member} answered no proposal with a level")
                continue
            ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("step")
            ax.set_ylabel("solve rate")
            ax.grid(alpha=0.3)
            canvas.legend(ax, outside=True)
        for row in range(len(mine), len(axes)):
            axes[row][col].axis("off")  # fewer students than the run beside it
    fig.suptitle("Students' solve rate per difficulty level over time")
    canvas.save(fig, out_dir, "solve_rate_by_level.png")
    return canvas.FigureOut(
        "fig-solve-rate-by-level",
        "solve_rate_by_level.png",
        "Students' solve rate per difficulty level",
        "Per student (one panel each, every member that ever answered), the mean solve rate over the valid "
        "proposals of each level it answered as matched student that step, levels as colours (a step where it "
        "answered none of a level has no point). Where students learn shows as a level's line rising; the "
        "population's swings as the lines moving against their teachers' difficulty.",
        "Line charts: solve rate per difficulty level and step, one panel per student and run",
        notes,
    )
