"""What the teachers proposed per step, per task type: cut-offs, inputs, token entropy, distinct programs, and the
references the proposer prompts showed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..data import RunData
from . import canvas

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
                xs,
                canvas.smooth(ys, run.final_step),
                color=colors[name],
                lw=1.5,
                marker=canvas.marker(len(xs)),
                ms=3,
                label=label,
            )
            drawn = True
        if dotted:
            dx, dy = run.series(f"task/{name}/{dotted}")
            if dx:
                ax.plot(
                    dx,
                    canvas.smooth(dy, run.final_step),
                    color=colors[name],
                    lw=1.2,
                    ls=":",
                    label=f"{name}{dotted_suffix}",
                )
                drawn = True
    return drawn


NOT_LOGGED = "not logged (runs recorded before these metrics were)"


def proposals(runs: list[RunData], out_dir: Path) -> canvas.FigureOut:
    """What the teachers proposed per step: cut-offs, input length, token entropy estimate, distinct programs."""
    rows = ("cut off", "input length", "entropy", "distinct")
    fig, axes = canvas.figure(len(rows), len(runs), 4.6, 2.6, sharey=False)
    notes = []
    for col, run in enumerate(runs):
        colors = canvas.member_colors(run)
        ax = axes[0][col]
        ax.set_title(run.label, fontsize=10)
        if not _task_panel(ax, run, "cut_off_rate"):
            canvas.empty(ax, NOT_LOGGED)
            notes.append(f"{run.label}: no proposal metrics in events.jsonl ({NOT_LOGGED})")
            for row in range(1, len(rows)):
                canvas.empty(axes[row][col], NOT_LOGGED)
            continue
        ax.set_ylim(-0.03, 1.03)
        ax = axes[1][col]
        if not _task_panel(ax, run, "input_chars"):
            canvas.empty(ax, "no valid proposals")
        ax = axes[2][col]
        drawn, trainer = 0, False
        for m in run.teachers():
            xs, ys = run.member_series(m, "token_nll")
            if xs:
                ax.plot(xs, canvas.smooth(ys, run.final_step), color=colors[m], lw=1.1, label=m)
                drawn += 1
            ex, ey = run.member_series(m, "train/entropy")
            if ex and any(ey):
                ax.plot(ex, canvas.smooth(ey, run.final_step), color=colors[m], lw=1.0, ls="--", label="_trainer")
                trainer = True
        if drawn:  # what the two line styles are, once (each member's colour is named by its solid line)
            ax.plot([], [], color="0.3", lw=1.1, label="solid: sampled-token NLL")
        if trainer:
            ax.plot([], [], color="0.3", lw=1.0, ls="--", label="dashed: trainer's exact entropy")
        xs, ys = run.series("teacher/token_nll")
        if xs:
            ax.plot(xs, canvas.smooth(ys, run.final_step), color="black", lw=2.0, label="all teachers")
        if not drawn and not xs:
            canvas.empty(ax, "no log-probs logged for the proposals")
            notes.append(f"{run.label}: the engine gave no log-probs, so no entropy estimate")
        ax = axes[3][col]
        if not _task_panel(ax, run, "distinct_programs", dotted="valid_proposals", dotted_suffix=" (valid)"):
            canvas.empty(ax, "no valid proposals")
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
    canvas.save(fig, out_dir, "proposals.png")
    return canvas.FigureOut(
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
        canvas.legend(row[col], run, outside=True)


def references(runs: list[RunData], out_dir: Path) -> canvas.FigureOut:
    """The references the deduction/abduction proposer prompts showed, beside the buffer they were drawn from."""
    from matplotlib.ticker import MaxNLocator

    rows = 4
    fig, axes = canvas.figure(rows, len(runs), 4.6, 2.5, sharey=False)
    notes = []
    for col, run in enumerate(runs):
        axes[0][col].set_title(run.label, fontsize=10)
        if not run.task_names("references/shown"):
            for row in range(rows):
                canvas.empty(
                    axes[row][col], "no references logged (no deduction/abduction tasks, or " + NOT_LOGGED + ")"
                )
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
            canvas.empty(axes[3][col], "no prompt lengths logged")
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
    canvas.save(fig, out_dir, "references.png")
    return canvas.FigureOut(
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
