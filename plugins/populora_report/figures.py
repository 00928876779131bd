"""The paper's figures as PNGs, one panel per run side by side (matplotlib imported inside functions).

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas directly, never pyplot, so
rendering touches no global backend state and works headless.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import dynamics
from .compare import Comparison, comparisons
from .compare import headline as run_headline
from .data import COMPLEXITY, RunData, arms
from .summary import _pct, _points

ROLE_COLORS = {"teacher": "tab:blue", "student": "tab:orange", "both": "tab:green"}
SMOOTH_ABOVE = 30  # steps; longer runs get a trailing mean so per-member lines stay readable
MAX_LEGEND = 14
LINEAGE_LABELS = 30  # children per run; more and the edge labels would cover the tree


@dataclass
class FigureOut:
    id: str
    file: str
    title: str
    caption: str
    alt: str
    notes: list[str] = field(default_factory=list)
    #: what makes the figure's comparison unfair (different steps, compute, base model): shown in red on the page
    warnings: list[str] = field(default_factory=list)


# --- helpers --------------------------------------------------------------------------------------


def _figure(rows: int, cols: int, width: float, height: float, sharey: bool = True) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(width, 8.0 if cols == 1 else 5.5) * cols, height * rows), layout="constrained", dpi=100)
    axes = fig.subplots(rows, cols, squeeze=False, sharey="row" if sharey else False)
    return fig, axes


def _save(fig: Any, out_dir: Path, name: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    _label_ends(fig)
    fig.savefig(out_dir / name, format="png")


END_LABEL = "end-label"  # gid of a line to be named at its last point instead of in the legend


def _label_ends(fig: Any, fontsize: float = 7.0) -> None:
    """Name every line marked ``END_LABEL`` at its last point, in its colour: with a dozen members or more no
    legend can say which line is whose. Labels whose ends lie closer than a label's width form one column at the
    right of the group, pushed apart vertically, a thin leader to a label that moved."""
    axes = {}
    for ax in fig.axes:
        lines = [ln for ln in ax.get_lines() if ln.get_gid() == END_LABEL and len(ln.get_xdata())]
        if lines:
            axes[ax] = lines
            x0, x1 = ax.get_xlim()
            ax.set_xlim(x0, x1 + 0.16 * (x1 - x0))  # room for the labels right of the last step
    if not axes:
        return
    fig.draw_without_rendering()  # the axes' place in pixels under the constrained layout
    px = fig.dpi / 72 * fontsize  # one em in pixels
    for ax, lines in axes.items():
        to_data = ax.transData.inverted()
        ends = sorted(
            (
                (tuple(ax.transData.transform((float(ln.get_xdata()[-1]), float(ln.get_ydata()[-1])))), ln)
                for ln in lines
            ),
            key=lambda end: end[0],  # by place only: two lines ending at one point must not compare the lines
        )
        width = max(len(str(ln.get_label())) for ln in lines) * 0.62 * px + 6  # the widest label, and a margin
        top = ax.get_window_extent().y1
        column: list[tuple[tuple[float, float], Any]] = []
        for i, end in enumerate(ends):
            column.append(end)
            if i + 1 < len(ends) and ends[i + 1][0][0] - end[0][0] < width:
                continue  # the next end is too close to the right: one column
            x = column[-1][0][0] + 0.4 * px
            column.sort(key=lambda e: e[0][1])
            for ((ex, ey), ln), at in zip(column, _spread([e[0][1] for e in column], 1.2 * px, top)):
                moved = abs(at - ey) > 0.6 * px or x - ex > px
                ax.annotate(
                    str(ln.get_label()),
                    xy=tuple(to_data.transform((ex, ey))),
                    xytext=tuple(to_data.transform((x, at))),
                    fontsize=fontsize,
                    color=_readable(ln.get_color()),
                    va="center",
                    ha="left",
                    arrowprops={"arrowstyle": "-", "color": ln.get_color(), "lw": 0.5, "alpha": 0.6} if moved else None,
                )
            column = []


def _readable(color: Any) -> tuple[float, float, float]:
    """``color`` darkened until text in it reads on white (tab20's light halves do not)."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    luminance = 0.299 * r + 0.587 * g + 0.114 * b
    scale = min(1.0, 0.45 / luminance) if luminance else 1.0
    return r * scale, g * scale, b * scale


def _spread(ys: list[float], gap: float, top: float) -> list[float]:
    """Positions near the sorted ``ys``, at least ``gap`` apart, the highest at most ``top - gap / 2``."""
    out: list[float] = []
    for y in ys:
        out.append(max(y, out[-1] + gap) if out else y)
    for i in range(len(out) - 1, -1, -1):  # pushed past the top: shift back down, keeping the gaps
        out[i] = min(out[i], top - gap / 2 if i == len(out) - 1 else out[i + 1] - gap)
    return out


def member_colors(run: RunData) -> dict[str, Any]:
    """A stable colour per member of a run, shared by every figure; never grey, which marks the base model and
    the single-agent baseline."""
    from matplotlib import colormaps

    members = run.member_ids()
    cmap = colormaps["tab10" if len(members) <= 9 else "tab20"]
    palette = [c for c in (cmap(i) for i in range(cmap.N)) if max(c[:3]) - min(c[:3]) > 0.05]
    return {m: palette[i % len(palette)] for i, m in enumerate(members)}


def _empty(ax: Any, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="0.35", wrap=True)
    ax.axis("off")  # not set_xticks([]): axes share their y-axis within a row


def _legend(ax: Any, run: RunData | None = None, *, outside: bool = False) -> None:
    """A legend; past MAX_LEGEND entries the members' lines are named at their last point instead."""
    from matplotlib.lines import Line2D

    handles, labels = ax.get_legend_handles_labels()
    if len(handles) > MAX_LEGEND and run is not None:
        members = set(run.member_ids())
        keep = []
        for h, lab in zip(handles, labels):
            if lab.split(" ")[0].split("@")[0] in members and isinstance(h, Line2D):
                h.set_gid(END_LABEL)  # named at its end instead
            else:
                keep.append((h, lab))
        if len(keep) < len(handles):
            keep.append((Line2D([], [], color="0.6", lw=1), "members: named at their last point"))
        handles, labels = [h for h, _ in keep], [lab for _, lab in keep]
    if handles and outside:  # right of the panel: dots at any height would hide behind a legend inside
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), framealpha=0.8)
    elif handles:
        ax.legend(handles, labels, fontsize=7, ncol=max(1, min(4, (len(handles) + 5) // 6)), loc="best", framealpha=0.8)


def _smooth(ys: list[float], n_steps: int) -> list[float]:
    window = max(1, n_steps // 15) if n_steps > SMOOTH_ABOVE else 1
    if window == 1:
        return ys
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _marker(n_points: int) -> str | None:
    return "o" if n_points <= 30 else None


def _plot_members(ax: Any, run: RunData, members: list[str], metric: str, colors: dict[str, Any]) -> int:
    drawn = 0
    for m in members:
        xs, ys = run.member_series(m, metric)
        if not xs:
            continue
        ax.plot(xs, _smooth(ys, run.final_step), label=m, color=colors[m], lw=1.2, marker=_marker(len(xs)), ms=3)
        drawn += 1
    return drawn


# --- figures --------------------------------------------------------------------------------------


def solve_rates(runs: list[RunData], out_dir: Path) -> FigureOut:
    fig, axes = _figure(1, len(runs), 4.6, 3.6)
    notes = []
    for ax, run in zip(axes[0], runs):
        ax.set_title(run.label, fontsize=10)
        students = run.students()
        colors = member_colors(run)
        if not run.steps or not _plot_members(ax, run, students, "solve_rate", colors):
            _empty(ax, "no student solve rates logged")
            notes.append(f"{run.label}: no student solve rates in events.jsonl")
            continue
        xs, ys = run.series("solve_rate")
        if xs:
            ax.plot(xs, _smooth(ys, run.final_step), color="black", lw=2.2, label="all students")
        ax.set_xlabel("step")
        ax.set_ylabel("solve rate (share of solver samples)")
        ax.grid(alpha=0.3)
        _legend(ax, run, outside=True)
    axes[0][0].set_ylim(bottom=-0.02)  # from 0 up to the data (shared by the row), not always to 1
    fig.suptitle("Student solve rates over time")
    _save(fig, out_dir, "solve_rates.png")
    return FigureOut(
        "fig-solve-rates",
        "solve_rates.png",
        "Student solve rates over time",
        "Fraction of correct solver samples per student and step (thin), all students together (black). "
        f"Runs longer than {SMOOTH_ABOVE} steps are smoothed with a trailing mean over 1/15 of the run.",
        "Line chart: student solve rate per step, one panel per run",
        notes,
    )


def complexity(runs: list[RunData], out_dir: Path) -> FigureOut:
    fig, axes = _figure(len(COMPLEXITY), len(runs), 4.6, 2.6)
    notes = []
    for col, run in enumerate(runs):
        teachers = run.teachers()
        colors = member_colors(run)
        for row, (metric, label) in enumerate(COMPLEXITY):
            ax = axes[row][col]
            if row == 0:
                ax.set_title(run.label, fontsize=10)
            drawn = _plot_members(ax, run, teachers, metric, colors)
            xs, ys = run.problem_metric_mean(metric)
            if xs:
                ax.plot(xs, _smooth(ys, run.final_step), color="black", lw=2.2, label="all teacher-written")
            if not drawn and not xs:
                _empty(ax, f"no {label} logged (no valid proposals)")
                if row == 0:
                    notes.append(f"{run.label}: no teacher program metrics")
                continue
            ax.grid(alpha=0.3)
            ax.set_ylabel(label)
            ax.set_xlabel("step")
            if row == 0:
                _legend(ax, run, outside=True)
    fig.suptitle("Teacher program complexity over time (valid proposals whose program the teacher wrote)")
    _save(fig, out_dir, "complexity.png")
    return FigureOut(
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


def _scope_title(scope: str) -> str:
    return f" ({scope.rstrip('/')})" if scope else ""


def difficulty(runs: list[RunData], out_dir: Path) -> FigureOut | None:
    """Each teacher's mean proposal difficulty per step; no figure when no run's task declares levels."""
    scopes = list(dict.fromkeys(scope for run in runs for scope in run.difficulty_scopes()))
    if not scopes:
        (out_dir / "difficulty.png").unlink(missing_ok=True)  # a report rendered again keeps no other run's figure
        return None
    fig, axes = _figure(len(scopes), len(runs), 4.6, 3.2)
    notes = []
    for col, run in enumerate(runs):
        colors = member_colors(run)
        for row, scope in enumerate(scopes):
            ax = axes[row][col]
            ax.set_title(run.label + _scope_title(scope), fontsize=10)
            drawn = _plot_members(ax, run, run.teachers(), f"{scope}difficulty", colors)
            xs, ys = run.series(f"teacher/{scope}difficulty")
            if xs:
                ax.plot(xs, _smooth(ys, run.final_step), color="black", lw=2.2, label="all teachers")
            if not drawn and not xs:
                _empty(ax, "no difficulty logged (its tasks declare no levels)")
                notes.append(f"{run.label}: no proposal difficulty{_scope_title(scope)} in events.jsonl")
                continue
            levels = sorted({lv for found in run.level_members(scope).values() for lv in found})
            if levels:  # the declared range, so a rise reads against how far it could go
                ax.set_ylim(levels[0] - 0.3, levels[-1] + 0.3)
            ax.set_xlabel("step")
            ax.set_ylabel("mean difficulty (level)\nof valid proposals")
            ax.grid(alpha=0.3)
            _legend(ax, run, outside=True)
    fig.suptitle("Teachers' proposal difficulty over time")
    _save(fig, out_dir, "difficulty.png")
    return FigureOut(
        "fig-difficulty",
        "difficulty.png",
        "Teachers' proposal difficulty over time",
        "Mean difficulty (the task's level) of the valid proposals each teacher wrote per step (thin; a child's "
        "line starts at its birth), and of all teachers' (black). Teachers rewarded by their students' failures "
        "should push it up; a single agent calibrates to what it can solve. "
        f"Runs longer than {SMOOTH_ABOVE} steps are smoothed with a trailing mean over 1/15 of the run.",
        "Line chart: mean proposal difficulty per teacher and step, one panel per run",
        notes,
    )


def solve_rate_by_level(runs: list[RunData], out_dir: Path) -> FigureOut | None:
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
    fig, axes = _figure(max(map(len, panels)), len(runs), 4.6, 2.6)
    notes = []
    for col, (run, mine) in enumerate(zip(runs, panels)):
        if not mine:
            _empty(axes[0][col], "no solve rates per level logged (its tasks declare no levels)")
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
                        _smooth(ys, run.final_step),
                        color=color[level],
                        lw=1.2,
                        marker=_marker(len(xs)),
                        ms=3,
                        label=f"level {level}",
                    )
                    drawn = True
            if not drawn:
                _empty(ax, f"{member} answered no proposal with a level")
                continue
            ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("step")
            ax.set_ylabel("solve rate")
            ax.grid(alpha=0.3)
            _legend(ax, outside=True)
        for row in range(len(mine), len(axes)):
            axes[row][col].axis("off")  # fewer students than the run beside it
    fig.suptitle("Students' solve rate per difficulty level over time")
    _save(fig, out_dir, "solve_rate_by_level.png")
    return FigureOut(
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


TASK_COLORS = {"deduction": "tab:blue", "abduction": "tab:orange", "induction": "tab:green"}


def _task_colors(names: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    others = colormaps["Dark2"]
    return {n: TASK_COLORS.get(n, others(i % others.N)) for i, n in enumerate(names)}


def _task_panel(
    ax: Any, run: RunData, metric: str, *, dotted: str | None = None, suffix: str = "", dotted_suffix: str = ""
) -> bool:
    """One line per task type of ``task/<name>/<metric>`` (and a dotted one of ``dotted``); False if none logged."""
    series = run.task_series(metric)
    names = list(series) + [n for n in (run.task_names(dotted) if dotted else []) if n not in series]
    colors = _task_colors(names)
    drawn = False
    for name in names:
        xs, ys = series.get(name, ([], []))
        if xs:
            label = f"{name}{suffix}"
            ax.plot(
                xs, _smooth(ys, run.final_step), color=colors[name], lw=1.5, marker=_marker(len(xs)), ms=3, label=label
            )
            drawn = True
        if dotted:
            dx, dy = run.series(f"task/{name}/{dotted}")
            if dx:
                ax.plot(
                    dx, _smooth(dy, run.final_step), color=colors[name], lw=1.2, ls=":", label=f"{name}{dotted_suffix}"
                )
                drawn = True
    return drawn


NOT_LOGGED = "not logged (runs recorded before these metrics were)"


def proposals(runs: list[RunData], out_dir: Path) -> FigureOut:
    """What the teachers proposed per step: cut-offs, input length, token entropy estimate, distinct programs."""
    rows = ("cut off", "input length", "entropy", "distinct")
    fig, axes = _figure(len(rows), len(runs), 4.6, 2.6, sharey=False)
    notes = []
    for col, run in enumerate(runs):
        colors = member_colors(run)
        ax = axes[0][col]
        ax.set_title(run.label, fontsize=10)
        if not _task_panel(ax, run, "cut_off_rate"):
            _empty(ax, NOT_LOGGED)
            notes.append(f"{run.label}: no proposal metrics in events.jsonl ({NOT_LOGGED})")
            for row in range(1, len(rows)):
                _empty(axes[row][col], NOT_LOGGED)
            continue
        ax.set_ylim(-0.03, 1.03)
        ax = axes[1][col]
        if not _task_panel(ax, run, "input_chars"):
            _empty(ax, "no valid proposals")
        ax = axes[2][col]
        drawn, trainer = 0, False
        for m in run.teachers():
            xs, ys = run.member_series(m, "token_nll")
            if xs:
                ax.plot(xs, _smooth(ys, run.final_step), color=colors[m], lw=1.1, label=m)
                drawn += 1
            ex, ey = run.member_series(m, "train/entropy")
            if ex and any(ey):
                ax.plot(ex, _smooth(ey, run.final_step), color=colors[m], lw=1.0, ls="--", label="_trainer")
                trainer = True
        if drawn:  # what the two line styles are, once (each member's colour is named by its solid line)
            ax.plot([], [], color="0.3", lw=1.1, label="solid: sampled-token NLL")
        if trainer:
            ax.plot([], [], color="0.3", lw=1.0, ls="--", label="dashed: trainer's exact entropy")
        xs, ys = run.series("teacher/token_nll")
        if xs:
            ax.plot(xs, _smooth(ys, run.final_step), color="black", lw=2.0, label="all teachers")
        if not drawn and not xs:
            _empty(ax, "no log-probs logged for the proposals")
            notes.append(f"{run.label}: the engine gave no log-probs, so no entropy estimate")
        ax = axes[3][col]
        if not _task_panel(ax, run, "distinct_programs", dotted="valid_proposals", dotted_suffix=" (valid)"):
            _empty(ax, "no valid proposals")
        _finish_column(
            axes,
            col,
            run,
            (
                "share cut off by\npropose_max_tokens",
                "mean input length (chars),\nvalid proposals",
                "teacher token entropy\n(nats per token)",
                "distinct valid programs",
            ),
        )
    fig.suptitle("Teacher proposals per step: cut-offs, inputs, token entropy, distinct programs")
    _save(fig, out_dir, "proposals.png")
    return FigureOut(
        "fig-proposals",
        "proposals.png",
        "Teacher proposals per step",
        'Per task type: the share of generated proposals cut off by the token budget (finish reason "length", '
        "scored as invalid), the mean input length in characters of valid proposals (shorter inputs make easier "
        "problems that AST metrics do not see), and distinct valid program texts (dotted: valid proposals; a "
        "collapsing teacher repeats itself). Middle: the mean negative log-probability of the sampled proposal "
        "tokens per teacher (solid; an unbiased estimate of the per-token entropy at temperature 1 and top_p 1) "
        "and, dashed where the trainer logs it, the exact entropy the trainer computed over the teacher's update "
        "(all its proposals). Falling entropy with fewer distinct programs is mode collapse.",
        "Line charts per run: cut-off share, input length, token entropy and distinct programs per step",
        notes,
    )


def _finish_column(axes: Any, col: int, run: RunData, ylabels: tuple[str, ...]) -> None:
    """Grid, legend and axis labels on each panel of one run's column."""
    for row, ylabel in zip(axes, ylabels):
        row[col].grid(alpha=0.3)
        row[col].set_xlabel("step")
        row[col].set_ylabel(ylabel)
        _legend(row[col], run, outside=True)


def references(runs: list[RunData], out_dir: Path) -> FigureOut:
    """The references the deduction/abduction proposer prompts showed, beside the buffer they were drawn from."""
    from matplotlib.ticker import MaxNLocator

    rows = 4
    fig, axes = _figure(rows, len(runs), 4.6, 2.5, sharey=False)
    notes = []
    for col, run in enumerate(runs):
        axes[0][col].set_title(run.label, fontsize=10)
        if not run.task_names("references/shown"):
            for row in range(rows):
                _empty(axes[row][col], "no references logged (no deduction/abduction tasks, or " + NOT_LOGGED + ")")
            notes.append(f"{run.label}: no reference metrics in events.jsonl")
            continue
        _task_panel(
            axes[0][col], run, "references/shown", dotted="references/drawn", suffix=" shown", dotted_suffix=" drawn"
        )
        _task_panel(
            axes[1][col],
            run,
            "references/program_chars",
            dotted="buffer/program_chars",
            suffix=" shown",
            dotted_suffix=" buffer",
        )
        _task_panel(axes[2][col], run, "references/over_budget")
        axes[2][col].yaxis.set_major_locator(MaxNLocator(integer=True))  # a count of prompts
        axes[2][col].set_ylim(-0.1, max(1.0, axes[2][col].get_ylim()[1]))
        if not _task_panel(axes[3][col], run, "prompt_tokens", dotted="prompt_tokens_max", dotted_suffix=" max"):
            _empty(axes[3][col], "no prompt lengths logged")
        _finish_column(
            axes,
            col,
            run,
            (
                "references per prompt",
                "mean program length\n(chars)",
                "prompts over the\nbudget (count)",
                "proposer prompt\ntokens",
            ),
        )
        over = sum(sum(ys) for _, ys in run.task_series("references/over_budget").values())
        if over:
            notes.append(f"{run.label}: {over:.0f} proposer prompts could not hold their K references in the budget")
    fig.suptitle("References in the proposer prompts: shown vs drawn, their length vs the buffer's")
    _save(fig, out_dir, "references.png")
    return FigureOut(
        "fig-references",
        "references.png",
        "References shown to the teachers",
        "Per deduction/abduction task: references shown per proposer prompt (solid) and drawn (dotted; K, or the "
        "buffer's size while it holds fewer); the mean program length of the references shown (solid) beside the "
        "buffer's mean program length (dotted): drawn uniformly and all shown (AZR), the two agree, while a filter "
        "that skips long references puts the solid line below; the prompts per step whose K references did not "
        "fit the compact budget (proposer_max_chars: shown whole and counted, or skipped with references_fit: "
        "skip_long); and the proposer prompts' mean length in tokens (dotted: the longest), against the "
        "model's positions and rollout.max_prompt_tokens.",
        "Line charts per run: references shown and drawn, their program length vs the buffer, prompts over budget",
        notes,
    )


def coverage(runs: list[RunData], out_dir: Path) -> FigureOut:
    fig, axes = _figure(1, len(runs), 4.6, 3.6)
    notes = []
    for ax, run in zip(axes[0], runs):
        ax.set_title(run.label, fontsize=10)
        colors = member_colors(run)
        drawn = _plot_members(ax, run, run.students(), "coverage", colors)
        xs, ys = run.proposal_coverage()
        if xs:
            ax.plot(xs, ys, color="black", lw=1.6, ls="--", label="all valid proposals")
        if not drawn and not xs:
            _empty(ax, "no coverage logged")
            notes.append(f"{run.label}: no coverage in events.jsonl")
            continue
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel("distinct problem signatures\n(cumulative)")
        ax.grid(alpha=0.3)
        _legend(ax, run, outside=True)
    fig.suptitle("Cumulative problem-space coverage per student")
    _save(fig, out_dir, "coverage.png")
    return FigureOut(
        "fig-coverage",
        "coverage.png",
        "Cumulative problem-space coverage",
        "Distinct problem signatures each student has been trained on so far (a child starts from zero), "
        "and distinct signatures among all valid proposals of the population (dashed).",
        "Line chart: cumulative distinct problem signatures per student, one panel per run",
        notes,
    )


def ratings(runs: list[RunData], out_dir: Path) -> FigureOut:
    from matplotlib.lines import Line2D

    fig, axes = _figure(2, len(runs), 5.2, 3.2)
    notes = []
    for col, run in enumerate(runs):
        top, bottom = axes[0][col], axes[1][col]
        top.set_title(run.label, fontsize=10)
        colors = member_colors(run)
        roles = run.roles()
        drawn = 0
        for m in run.member_ids():
            xs, mu = run.member_series(m, "rating_mu")
            sx, sigma = run.member_series(m, "rating_sigma")
            if not xs:
                continue
            style = "--" if roles.get(m) == "student" else "-"
            top.plot(xs, mu, color=colors[m], lw=1.3, ls=style, label=m, gid=END_LABEL)
            if sx == xs:
                conservative = [a - 3 * b for a, b in zip(mu, sigma)]
                bottom.plot(xs, conservative, color=colors[m], lw=1.3, ls=style, label=m, gid=END_LABEL)
            drawn += 1
        if not drawn:
            _empty(top, "no ratings logged")
            _empty(bottom, "no ratings logged")
            notes.append(f"{run.label}: no ratings in events.jsonl")
            continue
        if run.is_baseline:
            notes.append(f"{run.label}: single-agent baseline, ratings are not updated")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            ax.set_xlabel("step")
        top.set_ylabel("TrueSkill μ")
        bottom.set_ylabel("conservative rating μ−3σ")
        styles = [
            Line2D([], [], color="0.3", ls="-", label="teacher"),
            Line2D([], [], color="0.3", ls="--", label="student"),
        ]
        top.legend(handles=styles, fontsize=7, loc="best", framealpha=0.8)
    fig.suptitle("Ratings per member, each line named at its last step (teachers solid, students dashed)")
    _save(fig, out_dir, "ratings.png")
    return FigureOut(
        "fig-ratings",
        "ratings.png",
        "Rating curves per member",
        "TrueSkill mean μ (top) and the conservative rating μ−3σ that selection ranks by (bottom) per "
        "member over the steps it exists, each line named where it ends (a replaced member's line ends at its "
        "replacement); the gap between them is three times the rating's uncertainty σ.",
        "Line charts: rating mu and mu minus 3 sigma per member, one column per run",
        notes,
    )


def _lanes(run: RunData) -> list[str]:
    """Members ordered depth-first from the initial ones, each child right below its first parent."""
    roles = run.roles()
    births = run.births()
    kids: dict[str, list[str]] = {}
    has_parent = set()
    for rec in run.children():
        parent = str(rec["parents"][0]).split("@")[0]
        kids.setdefault(parent, []).append(rec["member"])
        has_parent.add(rec["member"])
    order: list[str] = []
    role_rank = {"teacher": 0, "both": 1, "student": 2}

    def visit(m: str) -> None:
        if m in order:
            return
        order.append(m)
        for child in sorted(kids.get(m, []), key=lambda c: (births.get(c, 0), c)):
            visit(child)

    members = run.member_ids()
    for root in sorted(
        (m for m in members if m not in has_parent), key=lambda m: (role_rank.get(roles.get(m, ""), 3), births[m])
    ):
        visit(root)
    for m in members:
        visit(m)
    return order


def lineage(runs: list[RunData], out_dir: Path) -> FigureOut:
    from matplotlib import colormaps
    from matplotlib.lines import Line2D

    lanes = {run.label: _lanes(run) for run in runs}
    tallest = max((len(v) for v in lanes.values()), default=1)
    per_lane = 0.42 if tallest <= 40 else 0.26
    fig, axes = _figure(1, len(runs), 5.2, min(max(2.2, per_lane * tallest + 1.4), 60.0), sharey=False)
    operators = sorted({str(rec.get("operator", "?")) for run in runs for rec in run.children()})
    palette = colormaps["Dark2"]
    op_color = {op: palette(i % palette.N) for i, op in enumerate(operators)}
    notes = []
    for ax, run in zip(axes[0], runs):
        ax.set_title(run.label, fontsize=10)
        order = lanes[run.label]
        if not order:
            _empty(ax, "no members recorded")
            notes.append(f"{run.label}: no lineage.jsonl or members")
            continue
        roles, births, deaths = run.roles(), run.births(), run.deaths()
        end = max(run.final_step, max(births.values(), default=0))
        lane = {m: i for i, m in enumerate(order)}
        span = max(end, 1)
        children = run.children()
        labelled = len(children) <= LINEAGE_LABELS
        for m in order:
            y = lane[m]
            color = ROLE_COLORS.get(roles.get(m, ""), "0.4")
            stop = deaths.get(m, end)
            ax.plot([births[m], stop], [y, y], color=color, lw=2.0, alpha=0.55, solid_capstyle="butt")
            ax.plot([births[m]], [y], "o", color=color, ms=7 if labelled else 4, zorder=3)
            if m in deaths:
                ax.plot([stop], [y], "x", color="black", ms=7 if labelled else 4, mew=1.5, zorder=3)
            ax.text(births[m] - 0.015 * span, y, m, ha="right", va="center", fontsize=8 if labelled else 6)
        for rec in children:
            child, op = rec["member"], str(rec.get("operator", "?"))
            if child not in lane:
                continue
            for i, parent_version in enumerate(rec["parents"]):
                parent = str(parent_version).split("@")[0]
                if parent not in lane:
                    continue
                x = births[child]
                ax.annotate(
                    "",
                    xy=(x, lane[child]),
                    xytext=(x - 0.04 * span, lane[parent]),
                    arrowprops={
                        "arrowstyle": "-|>",
                        "color": op_color[op],
                        "lw": 1.1 if labelled else 0.7,
                        "alpha": 0.9 if labelled else 0.6,
                        "connectionstyle": "arc3,rad=-0.12",
                    },
                    zorder=2,
                )
                if i == 0 and labelled:
                    ax.text(
                        x + 0.012 * span,
                        (lane[child] + lane[parent]) / 2,
                        f"{op}\n{parent_version}",
                        fontsize=6.5,
                        va="center",
                        ha="left",
                        color="0.15",
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": op_color[op], "alpha": 0.85},
                        zorder=4,
                    )
        if not children:
            notes.append(f"{run.label}: no evolution events (no children born)")
            ax.text(0.98, 0.02, "no children born", transform=ax.transAxes, ha="right", fontsize=8, color="0.35")
        elif not labelled:
            notes.append(f"{run.label}: {len(children)} children, edges coloured by operator instead of labelled")
        ax.set_xlim(-0.12 * span, end + 0.15 * span)
        ax.set_ylim(tallest - 0.5, -0.7)  # same lane spacing in every panel
        ax.set_yticks([])
        ax.set_ylabel("member (one lane each)")
        ax.set_xlabel("step (birth → replacement)")
        ax.grid(axis="x", alpha=0.3)
    handles = [Line2D([], [], color=c, lw=3, label=r) for r, c in ROLE_COLORS.items()]
    handles.append(Line2D([], [], color="black", marker="x", ls="", label="replaced"))
    handles += [Line2D([], [], color=op_color[op], lw=1.5, label=f"operator: {op}") for op in operators]
    axes[0][-1].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("Lineage: members by birth step, edges parent → child labelled with the operator")
    _save(fig, out_dir, "lineage.png")
    return FigureOut(
        "fig-lineage",
        "lineage.png",
        "Lineage tree with operators",
        "Each member is a lane from its birth step (dot) to its replacement (×) or the end of the run; "
        "arrows go from each parent to the child, coloured by operator and labelled with the operator and "
        f"the parent version (labels are left out for runs with more than {LINEAGE_LABELS} children).",
        "Lineage tree: members as nodes by birth step, arrows from parents to children labelled with operators",
        notes,
    )


def _percent_limits(values: list[float], min_span: float = 6.0) -> tuple[float, float]:
    """Limits of an axis in percent (or points) around ``values``, padded, at least ``min_span`` wide: an axis
    from 0 to 100 would flatten the one or two points by which adapters differ on a probe of a few dozen problems."""
    lo, hi = min(values), max(values)
    pad = max(1.0, 0.12 * (hi - lo))
    lo, hi = lo - pad, hi + pad
    if hi - lo < min_span:
        mid = (lo + hi) / 2
        lo, hi = mid - min_span / 2, mid + min_span / 2
    return lo, hi


def _baseline_notes(runs: list[RunData]) -> list[str]:
    """One line per population run and baseline: their steps and compute ratio."""
    return [f"{c.run} vs {c.baseline}: {_comparison_line(c)}" for c in comparisons(runs)]


def _comparison_line(c: Comparison) -> str:
    ratio = "-" if c.per_slot_ratio is None else f"{c.per_slot_ratio:.2f}×"
    total = "" if c.total_ratio is None else f" (whole population {c.total_ratio:.2f}×)"
    return f"{c.steps[0]} vs {c.steps[1]} steps; trained tokens per population slot ÷ baseline's adapter {ratio}{total}"


def headline(runs: list[RunData], out_dir: Path) -> FigureOut:
    """Each final student's change in probe accuracy against the base, in points with its 95 % interval, best -
    base, and the single-agent baseline's own change: the report's answer, in the terminal summary's units."""
    import textwrap

    baselines = [r for r in runs if r.is_baseline]
    panels = [r for r in runs if not r.is_baseline] or baselines
    heads = {r.label: run_headline(r) for r in runs}
    rows_per_panel = max(len(heads[r.label]["students"]) + 1 + len(baselines) for r in panels)
    fig, axes = _figure(1, len(panels), 8.5, 0.45 * rows_per_panel + 2.4, sharey=False)
    found = comparisons(runs)
    notes: list[str] = []
    for ax, run in zip(axes[0], panels):
        head = heads[run.label]
        if head["base_accuracy"] is None or not head["students"]:
            _empty(ax, f"{run.label}: no probe evaluation of the base and the final students")
            notes.append(f"{run.label}: no probe of the base and the final students: no change to show")
            continue
        rows = _headline_rows(run, head, [b for b in baselines if b is not run], heads)
        values = [0.0]
        for y, (_, change, interval, color, _) in enumerate(rows):
            values += [100 * change] + ([100 * v for v in interval] if interval else [])
            marker = {"black": "D", AGENT: "s"}.get(color, "o")  # best − base, the single agent, a student
            style = {"marker": marker, "ms": 6, "color": color, "mfc": "white" if color == AGENT else color, "ls": ""}
            error = [[100 * (change - interval[0])], [100 * (interval[1] - change)]] if interval else None
            ax.errorbar([100 * change], [y], xerr=error, capsize=4, lw=1.6, **style)
        ax.axvline(0, color="0.3", lw=1)
        ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_xlim(*_percent_limits(values))
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlabel("change in probe accuracy against the base model (points)")
        ax.set_ylabel("final adapter (probe accuracy)")
        # the numbers themselves, as the terminal prints them, on the right-hand axis
        right = ax.twinx()
        right.set_ylim(ax.get_ylim())
        texts = [
            _points(change, interval) + (" within noise" if noise else "") for _, change, interval, _, noise in rows
        ]
        right.set_yticks(range(len(rows)), texts, fontsize=8)
        right.get_yticklabels()[len(head["students"])].set_fontweight("bold")  # best − base
        right.set_ylabel("change, 95 % interval")
        problems = head["probe_problems"]
        lines = [
            f"{run.label}: base {_pct(head['base_accuracy'])}, probe at step {head['probe_step']}"
            + (f" over {problems} problems" if problems else "")
        ]
        lines += [f"vs {c.baseline}: {_comparison_line(c)}" for c in found if c.run == run.label]
        ax.set_title("\n".join(textwrap.fill(line, 95) for line in lines), fontsize=9, loc="left")
        if any(r[2] is None for r in rows):
            notes.append(f"{run.label}: probe.jsonl has no per-problem outcomes, so no intervals")
    warnings = _warn(fig, found)
    fig.suptitle("Probe accuracy: change of each final student against the base model, 95 % intervals")
    _save(fig, out_dir, "headline.png")
    return FigureOut(
        "fig-headline",
        "headline.png",
        "Change against the base model",
        "Each final student's probe accuracy (in its label) and its change against the base model in points "
        "(1 point = 1 % of the probe problems), with the 95 % paired-bootstrap interval over the probe problems "
        "(the terminal summary's numbers); best − base (diamond) is the best student's change, chosen after the "
        "fact, so it is biased upwards and its interval too narrow; an interval that includes 0 is within "
        "noise. Open square: the single-agent baseline's adapter against its own base, with the runs' steps and the "
        "compute ratio above the panel, and a warning in red where the runs differ in steps, compute or base "
        "model.",
        "Dot plot: change in probe accuracy against the base model per final student with 95 % intervals",
        notes,
        warnings,
    )


WARNING_COLOR = "#b00020"
AGENT = "0.2"  # the single-agent baseline: dark grey, an open square as in probe.png


def _headline_rows(
    run: RunData, head: dict[str, Any], baselines: list[RunData], heads: dict[str, dict[str, Any]]
) -> list[tuple[str, float, list[float] | None, Any, bool | None]]:
    """(label, change, interval, colour, within noise) per final student, best − base and each baseline agent."""
    colors = member_colors(run)
    members = {s.version: s.member for s in run.probe_final()}
    rows = []
    for version, acc in head["students"].items():
        change = head["student_changes"][version]
        color = colors.get(members.get(version, ""), "tab:gray")
        rows.append((f"{version}  {_pct(acc)}", change["change"], change["interval"], color, change["within_noise"]))
    best = (head["best_minus_base"], head["best_minus_base_interval"], "black", head["best_within_noise"])
    rows.append(("best − base", *best))
    for b in baselines:
        other = heads[b.label]
        for version, acc in other["students"].items():
            change = other["student_changes"].get(version)
            if change is not None:
                label = f"single agent {version}  {_pct(acc)}\n({b.label})"
                rows.append((label, change["change"], change["interval"], AGENT, change["within_noise"]))
    return rows


def _warn(fig: Any, found: list[Comparison]) -> list[str]:
    """Every reason the population-vs-baseline comparison is unfair, in red at the figure's foot (so a PNG copied
    out of the report keeps them); returned for the page."""
    import textwrap

    warnings = [f"{c.run} vs {c.baseline}: {w}" for c in found for w in c.warnings]
    if warnings:
        width = int(fig.get_figwidth() * 11)  # characters of 9 pt text across the figure
        text = "\n".join(textwrap.fill("⚠ " + w, width) for w in warnings)
        fig.supxlabel(text, fontsize=9, color=WARNING_COLOR, fontweight="bold", ha="left", x=0.01)
    return warnings


def probe(runs: list[RunData], out_dir: Path) -> FigureOut:
    baselines = [r for r in runs if r.is_baseline]
    panels = [r for r in runs if not r.is_baseline] or baselines
    fig, axes = _figure(2, len(panels), 5.6, 3.8, sharey=True)
    notes = [f"{r.label}: no probe.jsonl" for r in runs if not r.probe]
    base_probed = [r for r in baselines if r.probe_final()]
    tops: list[float] = []
    bottoms: list[float] = []
    for col, run in enumerate(panels):
        dot_ax, time_ax = axes[0][col], axes[1][col]
        dot_ax.set_title(run.label, fontsize=10)
        final = run.probe_final()
        base = run.probe_base()
        if not final and base is None:
            _empty(dot_ax, "no probe evaluation (no probe.jsonl)" if not run.probe else "no usable probe records")
            _empty(time_ax, "no probe evaluation")
            continue
        others = [b for b in base_probed if b is not run]
        types = run.probe_task_types()
        for b in others:
            types += [t for t in b.probe_task_types() if t not in types]
        groups = [*types, "all"]
        colors = member_colors(run)
        dots: list[tuple[str, dict[str, float], dict[str, Any]]] = []
        for s in sorted(final, key=lambda s: -s.overall):
            dots.append(
                (s.version, {**s.by_type, "all": s.overall}, {"color": colors.get(s.member, "tab:gray"), "marker": "o"})
            )
        for b in others:
            agents = b.probe_final()
            acc = {
                g: sum(a.overall if g == "all" else a.by_type.get(g, float("nan")) for a in agents) / len(agents)
                for g in groups
            }
            label = f"single agent {b.label}" + (f" (mean of {len(agents)})" if len(agents) > 1 else "")
            dots.append((label, acc, {"color": "black", "marker": "s", "mfc": "white"}))
        width = 0.8 / max(len(dots), 1)
        if base is not None:
            base_acc = {**base.by_type, "all": base.overall}
            for g, group in enumerate(groups):
                if group in base_acc:
                    dot_ax.plot(
                        [g - 0.45, g + 0.45],
                        [100 * base_acc[group]] * 2,
                        color="0.5",
                        lw=2.5,
                        label="base" if g == 0 else None,
                    )
                    tops.append(100 * base_acc[group])
        for i, (label, acc, style) in enumerate(dots):
            shown = [
                (g, 100 * acc[group]) for g, group in enumerate(groups) if not math.isnan(acc.get(group, math.nan))
            ]
            dot_ax.plot(
                [g + (i - (len(dots) - 1) / 2) * width for g, _ in shown],
                [y for _, y in shown],
                ls="",
                ms=6,
                label=label,
                **style,
            )
            tops += [y for _, y in shown]
        dot_ax.set_xticks(range(len(groups)), groups)
        dot_ax.set_ylabel("probe accuracy (%)")
        dot_ax.grid(axis="y", alpha=0.3)
        step = final[0].step if final else base.step if base else 0
        dot_ax.set_xlabel(f"task type (students probed at step {step}; base: grey bar)")
        _legend(dot_ax, run, outside=True)

        series: dict[str, tuple[list[int], list[float]]] = {}
        for s in run.probe_summaries():
            if s.member == "base" or s.role == "base":
                continue
            xs, ys = series.setdefault(s.member, ([], []))
            xs.append(s.step)
            ys.append(100 * s.overall)
        for m, (xs, ys) in series.items():
            time_ax.plot(xs, ys, marker="o", ms=3, color=colors.get(m, "tab:gray"), label=m)
            bottoms += ys
        if base is not None:
            time_ax.axhline(100 * base.overall, color="0.45", ls="--", lw=1.4, label="base")
            bottoms.append(100 * base.overall)
        for b in others:
            per_step: dict[int, list[float]] = {}
            for s in b.probe_summaries():
                if s.member != "base" and s.role != "base":
                    per_step.setdefault(s.step, []).append(100 * s.overall)
            xs = sorted(per_step)
            ys = [sum(per_step[x]) / len(per_step[x]) for x in xs]
            time_ax.plot(xs, ys, color="black", ls=":", marker="s", ms=3, label=f"single agent {b.label}")
            bottoms += ys
        time_ax.set_xlabel("step")
        time_ax.set_ylabel("probe accuracy, all types (%)")
        time_ax.grid(alpha=0.3)
        _legend(time_ax, run, outside=True)
    if tops:
        axes[0][0].set_ylim(*_percent_limits(tops))
    if bottoms:
        axes[1][0].set_ylim(*_percent_limits(bottoms))
    notes += _baseline_notes(runs)
    if baselines and not base_probed:
        notes.append("the single-agent baseline has no probe records: no baseline points")
    if not baselines:
        notes.append("no single-agent baseline run given (a run whose recipe has population.mode: single_agent)")
    warnings = _warn(fig, comparisons(runs))
    fig.suptitle("Probe accuracy per student vs the base model and the single-agent baseline")
    _save(fig, out_dir, "probe.png")
    return FigureOut(
        "fig-probe",
        "probe.png",
        "Probe accuracy per student vs base and baseline",
        "Top: greedy accuracy on the held-out probe set per task type and overall (n-weighted) of every student "
        "at the last probe step (dots, best first), the base model (grey bar) and the single-agent baseline "
        "(open squares); the axis spans the data, not 0-100 %. Bottom: overall probe accuracy at every probe "
        "step. The intervals of the changes are in the figure above.",
        "Dot plot: probe accuracy per student, base model and baseline per task type; line chart over probe steps",
        notes,
        warnings,
    )


def _interval(stat: dict[str, Any], fmt: str) -> str:
    """``mean [low, high]`` of a pooled measure (the interval only with two or more seeds)."""
    if stat["mean"] is None:
        return "-"
    text = format(stat["mean"], fmt)
    return text if stat["low"] is None else f"{text} [{format(stat['low'], fmt)}, {format(stat['high'], fmt)}]"


def _arm_mean(series: list[tuple[list[int], list[float]]]) -> tuple[list[int], list[float]]:
    """Per step, the mean over an arm's runs of the runs that have that step."""
    acc: dict[int, list[float]] = {}
    for xs, ys in series:
        for x, y in zip(xs, ys):
            acc.setdefault(x, []).append(y)
    steps = sorted(acc)
    return steps, [sum(acc[x]) / len(acc[x]) for x in steps]


def _window_mean(ys: list[float], window: int) -> list[float]:
    return [sum(ys[i : i + window]) / window for i in range(len(ys) - window + 1)]


def arm_views(runs: list[RunData], out_dir: Path) -> FigureOut:
    """The paper's four views with the arms on shared axes: complexity, solve rate, coverage, probe."""
    groups = arms(runs)
    pooled = {arm.label: dynamics.pool([r.measures() for r in arm.runs]) for arm in groups}
    from matplotlib import colormaps

    palette = colormaps["tab10"]
    color = {arm.label: palette(i % palette.N) for i, arm in enumerate(groups)}
    fig, axes = _figure(2, 3, 5.5, 3.8, sharey=False)
    notes = []
    for col, (metric, label) in enumerate(COMPLEXITY):
        ax = axes[0][col]
        drawn = False
        for arm in groups:
            series = [dynamics.complexity_series(r.problems or [], metric) for r in arm.runs]
            for xs, ys in series:
                ax.plot(xs, ys, color=color[arm.label], lw=0.6, alpha=0.3)
            xs, ys = _arm_mean(series)
            if not xs:
                continue
            drawn = True
            stat = pooled[arm.label][f"complexity_slope/{metric}"]
            ax.plot(xs, ys, color=color[arm.label], lw=1.8, label=f"{arm.label}: {_interval(stat, '+.4f')}/step")
            b = dynamics.slope(xs, ys)
            if b is not None:
                a = sum(ys) / len(ys) - b * sum(xs) / len(xs)
                ax.plot([xs[0], xs[-1]], [a + b * xs[0], a + b * xs[-1]], color=color[arm.label], ls="--", lw=1.2)
        if not drawn:
            _empty(ax, f"no {label} logged (no valid proposals)")
            continue
        ax.set_title(f"teacher {label}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(f"{label} (mean per step)")
        ax.grid(alpha=0.3)
        _legend(ax)
    window = 5  # the oscillation measure's smoothing window
    ax = axes[1][0]
    for arm in groups:
        stat = pooled[arm.label]
        label = (
            f"{arm.label}: {_interval(stat['oscillation/swings'], '.1f')} swings, "
            f"amplitude {_interval(stat['oscillation/amplitude'], '.2f')}"
        )
        for i, run in enumerate(arm.runs):
            xs, ys = dynamics.solve_rate_series(run.steps)
            if len(ys) >= window:
                ax.plot(
                    xs[window - 1 :],
                    _window_mean(ys, window),
                    color=color[arm.label],
                    lw=1.0,
                    alpha=0.7,
                    label=label if i == 0 else None,
                )
    ax.set_title(f"student solve rate ({window}-step mean, one line per seed)", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("solve rate (share of solver samples)")
    ax.set_ylim(bottom=-0.02)
    ax.grid(alpha=0.3)
    _legend(ax)
    ax = axes[1][1]
    for arm in groups:
        stat = pooled[arm.label]
        series = []
        for run in arm.runs:
            xs, new, _ = dynamics.coverage_series(run.problems or [], [r["step"] for r in run.steps])
            cumulative = [sum(new[: i + 1]) for i in range(len(new))]
            series.append((xs, [float(c) for c in cumulative]))
            ax.plot(xs, cumulative, color=color[arm.label], lw=0.6, alpha=0.3)
        xs, ys = _arm_mean(series)
        if xs:
            ax.plot(
                xs,
                ys,
                color=color[arm.label],
                lw=1.8,
                label=f"{arm.label}: {_interval(stat['coverage/new_per_step'], '.2f')} new/step late, "
                f"{_interval(stat['coverage/new_per_valid_proposal'], '.2f')} per proposal",
            )
            last_third = [dynamics.coverage_growth(r.problems or [])["last_third_from"] for r in arm.runs]
            start = min((s for s in last_third if s is not None), default=None)
            if start is not None:
                ax.axvline(start, color=color[arm.label], ls=":", lw=1.0)
    ax.set_title("distinct task signatures of valid proposals (cumulative)", fontsize=10)
    ax.set_xlabel("step (dotted: start of the last third)")
    ax.set_ylabel("distinct signatures (cumulative)")
    ax.grid(alpha=0.3)
    _legend(ax)
    ax = axes[1][2]
    groups_x = ("base", "mean", "best", "weakest")
    width = 0.8 / max(len(groups), 1)
    values: list[float] = []
    for i, arm in enumerate(groups):
        stats = [pooled[arm.label][f"probe/{g}"] for g in groups_x]
        probed = [(g, s) for g, s in enumerate(stats) if s["mean"] is not None]
        if not probed:
            notes.append(f"{arm.label}: no probe records")
            continue
        positions = [g + (i - (len(groups) - 1) / 2) * width for g, _ in probed]
        means = [100 * s["mean"] for _, s in probed]
        low = [100 * (s["mean"] - s["low"]) if s["low"] is not None else 0.0 for _, s in probed]
        high = [100 * (s["high"] - s["mean"]) if s["high"] is not None else 0.0 for _, s in probed]
        values += [m - d for m, d in zip(means, low)] + [m + d for m, d in zip(means, high)]
        ax.errorbar(
            positions,
            means,
            yerr=[low, high],
            ls="",
            marker="o",
            ms=6,
            capsize=3,
            color=color[arm.label],
            label=f"{arm.label} ({len(arm.runs)} run{'s' if len(arm.runs) > 1 else ''})",
        )
    ax.set_xticks(range(len(groups_x)), ["base", "students' mean", "best", "weakest"])
    if values:
        ax.set_ylim(*_percent_limits(values))
    ax.set_title("probe accuracy at the last probe step (95 % interval over seeds)", fontsize=10)
    ax.set_xlabel("adapter")
    ax.set_ylabel("probe accuracy (%)")
    ax.grid(axis="y", alpha=0.3)
    _legend(ax)
    for arm in groups:
        seeds = sorted({r.recipe.get("seed") for r in arm.runs}, key=str)
        notes.append(f"{arm.label}: {len(arm.runs)} run(s), seeds {', '.join(map(str, seeds))}")
    warnings = _warn(fig, comparisons(runs))
    fig.suptitle("Arms side by side: teacher complexity, solve-rate oscillation, coverage growth, probe accuracy")
    _save(fig, out_dir, "arms.png")
    return FigureOut(
        "fig-arms",
        "arms.png",
        "Arms side by side: the four dynamics",
        "Runs whose recipes differ only in seed are one arm (thin lines: its runs; thick: their mean per step). "
        "Top: mean complexity of the valid programs the teachers wrote (deduction and abduction; induction's come "
        "from the buffers) per step with the least-squares line (dashed); the legend gives "
        "the slope per step, mean over seeds [95 % t-interval]. Bottom left: solve rate of all students' samples, "
        f"{window}-step mean; swings are changes between excursions beyond ±h of the detrended, smoothed rate "
        "(h: 3 standard errors of a window mean of the step-to-step noise, at least 0.01), amplitude peak to "
        "trough. Bottom middle: distinct signatures so far; the legend gives new ones per step and per valid "
        "proposal in the last third of the run. Bottom right: probe accuracy of the base and of the final "
        "students' mean, best and weakest, error bars the 95 % t-interval over seeds (with two seeds or more; "
        "the axis spans the data).",
        "Six panels: complexity metrics, solve rate, coverage and probe accuracy with the arms on shared axes",
        notes,
        warnings,
    )


FIGURES = (
    headline,
    arm_views,
    solve_rates,
    complexity,
    difficulty,
    solve_rate_by_level,
    proposals,
    references,
    coverage,
    ratings,
    lineage,
    probe,
)
