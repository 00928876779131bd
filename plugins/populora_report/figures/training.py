"""The training curves: students' solve rates, teachers' program complexity and the population's coverage, per
member and step."""

from __future__ import annotations

from pathlib import Path

from ..data import COMPLEXITY, RunData
from . import canvas


def solve_rates(runs: list[RunData], out_dir: Path) -> canvas.FigureOut:
    fig, axes = canvas.figure(1, len(runs), 4.6, 3.6)
    notes = []
    for ax, run in zip(axes[0], runs):
        ax.set_title(run.label, fontsize=10)
        students = run.students()
        colors = canvas.member_colors(run)
        if not run.steps or not canvas.plot_members(ax, run, students, "solve_rate", colors):
            canvas.empty(ax, "no student solve rates logged")
            notes.append(f"{run.label}: no student solve rates in events.jsonl")
            continue
        xs, ys = run.series("solve_rate")
        if xs:
            ax.plot(xs, canvas.smooth(ys, run.final_step), color="black", lw=2.2, label="all students")
        ax.set_xlabel("step")
        ax.set_ylabel("solve rate (share of solver samples)")
        ax.grid(alpha=0.3)
        canvas.legend(ax, run, outside=True)
    axes[0][0].set_ylim(bottom=-0.02)  # from 0 up to the data (shared by the row), not always to 1
    fig.suptitle("Student solve rates over time")
    canvas.save(fig, out_dir, "solve_rates.png")
    return canvas.FigureOut(
        "fig-solve-rates",
        "solve_rates.png",
        "Student solve rates over time",
        "Fraction of correct solver samples per student and step (thin), all students together (black). "
        f"Runs longer than {canvas.SMOOTH_ABOVE} steps are smoothed with a trailing mean over 1/15 of the run.",
        "Line chart: student solve rate per step, one panel per run",
        notes,
    )


def complexity(runs: list[RunData], out_dir: Path) -> canvas.FigureOut:
    fig, axes = canvas.figure(len(COMPLEXITY), len(runs), 4.6, 2.6)
    notes = []
    for col, run in enumerate(runs):
        teachers = run.teachers()
        colors = canvas.member_colors(run)
        for row, (metric, label) in enumerate(COMPLEXITY):
            ax = axes[row][col]
            if row == 0:
                ax.set_title(run.label, fontsize=10)
            drawn = canvas.plot_members(ax, run, teachers, metric, colors)
            xs, ys = run.problem_metric_mean(metric)
            if xs:
                ax.plot(xs, canvas.smooth(ys, run.final_step), color="black", lw=2.2, label="all teacher-written")
            if not drawn and not xs:
                canvas.empty(ax, f"no {label} logged (no valid proposals)")
                if row == 0:
                    notes.append(f"{run.label}: no teacher program metrics")
                continue
            ax.grid(alpha=0.3)
            ax.set_ylabel(label)
            ax.set_xlabel("step")
            if row == 0:
                canvas.legend(ax, run, outside=True)
    fig.suptitle("Teacher program complexity over time (valid proposals whose program the teacher wrote)")
    canvas.save(fig, out_dir, "complexity.png")
    return canvas.FigureOut(
        "fig-complexity",
        "complexity.png",
        "Teacher program complexity over time",
        "Mean AST depth, cyclomatic complexity and lines of code of the programs each teacher wrote per step "
        "(thin), and of every such valid proposal of the step (black): deduction and abduction, not induction, "
        "whose programs come from the buffers (runs recorded before the loop said so: every valid proposal in "
        "the thin lines, induction left out of the black one).",
        "Line charts: AST depth, cyclomatic complexity and LOC of teacher programs per step, one column per run",
        notes,
    )


def coverage(runs: list[RunData], out_dir: Path) -> canvas.FigureOut:
    fig, axes = canvas.figure(1, len(runs), 4.6, 3.6)
    notes = []
    for ax, run in zip(axes[0], runs):
        ax.set_title(run.label, fontsize=10)
        colors = canvas.member_colors(run)
        drawn = canvas.plot_members(ax, run, run.students(), "coverage", colors)
        xs, ys = run.proposal_coverage()
        if xs:
            ax.plot(xs, ys, color="black", lw=1.6, ls="--", label="all valid proposals")
        if not drawn and not xs:
            canvas.empty(ax, "no coverage logged")
            notes.append(f"{run.label}: no coverage in events.jsonl")
            continue
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel("distinct problem signatures\n(cumulative)")
        ax.grid(alpha=0.3)
        canvas.legend(ax, run, outside=True)
    fig.suptitle("Cumulative problem-space coverage per student")
    canvas.save(fig, out_dir, "coverage.png")
    return canvas.FigureOut(
        "fig-coverage",
        "coverage.png",
        "Cumulative problem-space coverage",
        "Distinct problem signatures each student has been trained on so far (a child starts from zero), "
        "and distinct signatures among all valid proposals of the population (dashed).",
        "Line chart: cumulative distinct problem signatures per student, one panel per run",
        notes,
    )
