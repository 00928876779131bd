"""The probe's answer: each final student's change in probe accuracy against the base and the single-agent
baseline (the headline), probe accuracy per task type and over steps, and what makes the comparison unfair."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..compare import Comparison, comparisons
from ..compare import headline as run_headline
from ..data import RunData
from ..summary import _pct, _points
from . import canvas

WARNING_COLOR = "#b00020"


AGENT = "0.2"  # the single-agent baseline: dark grey, an open square as in probe.png


def _baseline_notes(runs: list[RunData]) -> list[str]:
    """One line per population run and baseline: their steps and compute ratio."""
    return [f"{c.run} vs {c.baseline}: {_comparison_line(c)}" for c in comparisons(runs)]


def _comparison_line(c: Comparison) -> str:
    ratio = "-" if c.per_slot_ratio is None else f"{c.per_slot_ratio:.2f}×"
    total = "" if c.total_ratio is None else f" (whole population {c.total_ratio:.2f}×)"
    return f"{c.steps[0]} vs {c.steps[1]} steps; trained tokens per population slot ÷ baseline's adapter {ratio}{total}"


def headline(runs: list[RunData], out_dir: Path) -> canvas.FigureOut:
    """Each final student's change in probe accuracy against the base, in points with its 95 % interval, best -
    base, and the single-agent baseline's own change: the report's answer, in the terminal summary's units."""
    import textwrap

    baselines = [r for r in runs if r.is_baseline]
    panels = [r for r in runs if not r.is_baseline] or baselines
    heads = {r.label: run_headline(r) for r in runs}
    rows_per_panel = max(len(heads[r.label]["students"]) + 1 + len(baselines) for r in panels)
    fig, axes = canvas.figure(1, len(panels), 8.5, 0.45 * rows_per_panel + 2.4, sharey=False)
    found = comparisons(runs)
    notes: list[str] = []
    for ax, run in zip(axes[0], panels):
        head = heads[run.label]
        if head["base_accuracy"] is None or not head["students"]:
            canvas.empty(ax, f"{run.label}: no probe evaluation of the base and the final students")
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
        ax.set_xlim(*canvas.percent_limits(values))
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
    warnings = draw_warnings(fig, found)
    fig.suptitle("Probe accuracy: change of each final student against the base model, 95 % intervals")
    canvas.save(fig, out_dir, "headline.png")
    return canvas.FigureOut(
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


def _headline_rows(
    run: RunData, head: dict[str, Any], baselines: list[RunData], heads: dict[str, dict[str, Any]]
) -> list[tuple[str, float, list[float] | None, Any, bool | None]]:
    """(label, change, interval, colour, within noise) per final student, best − base and each baseline agent."""
    colors = canvas.member_colors(run)
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


def draw_warnings(fig: Any, found: list[Comparison]) -> list[str]:
    """Every reason the population-vs-baseline comparison is unfair, in red at the figure's foot (so a PNG copied
    out of the report keeps them); returned for the page."""
    import textwrap

    warnings = [f"{c.run} vs {c.baseline}: {w}" for c in found for w in c.warnings]
    if warnings:
        width = int(fig.get_figwidth() * 11)  # characters of 9 pt text across the figure
        text = "\n".join(textwrap.fill("⚠ " + w, width) for w in warnings)
        fig.supxlabel(text, fontsize=9, color=WARNING_COLOR, fontweight="bold", ha="left", x=0.01)
    return warnings


def probe(runs: list[RunData], out_dir: Path) -> canvas.FigureOut:
    baselines = [r for r in runs if r.is_baseline]
    panels = [r for r in runs if not r.is_baseline] or baselines
    fig, axes = canvas.figure(2, len(panels), 5.6, 3.8, sharey=True)
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
            canvas.empty(dot_ax, "no probe evaluation (no probe.jsonl)" if not run.probe else "no usable probe records")
            canvas.empty(time_ax, "no probe evaluation")
            continue
        others = [b for b in base_probed if b is not run]
        types = run.probe_task_types()
        for b in others:
            types += [t for t in b.probe_task_types() if t not in types]
        groups = [*types, "all"]
        colors = canvas.member_colors(run)
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
        canvas.legend(dot_ax, run, outside=True)

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
        canvas.legend(time_ax, run, outside=True)
    if tops:
        axes[0][0].set_ylim(*canvas.percent_limits(tops))
    if bottoms:
        axes[1][0].set_ylim(*canvas.percent_limits(bottoms))
    notes += _baseline_notes(runs)
    if baselines and not base_probed:
        notes.append("the single-agent baseline has no probe records: no baseline points")
    if not baselines:
        notes.append("no single-agent baseline run given (a run whose recipe has population.mode: single_agent)")
    warnings = draw_warnings(fig, comparisons(runs))
    fig.suptitle("Probe accuracy per student vs the base model and the single-agent baseline")
    canvas.save(fig, out_dir, "probe.png")
    return canvas.FigureOut(
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
