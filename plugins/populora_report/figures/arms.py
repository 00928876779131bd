"""Arms side by side: runs that differ only in seed pooled into one arm, the paper's four views on shared axes with
intervals over seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import dynamics
from ..compare import comparisons
from ..data import COMPLEXITY, RunData, arms
from . import canvas
from .evaluation import draw_warnings


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


def arm_views(runs: list[RunData], out_dir: Path) -> canvas.FigureOut:
    """The paper's four views with the arms on shared axes: complexity, solve rate, coverage, probe."""
    groups = arms(runs)
    pooled = {arm.label: dynamics.pool([r.measures() for r in arm.runs]) for arm in groups}
    from matplotlib import colormaps

    palette = colormaps["tab10"]
    color = {arm.label: palette(i % palette.N) for i, arm in enumerate(groups)}
    fig, axes = canvas.figure(2, 3, 5.5, 3.8, sharey=False)
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
            canvas.empty(ax, f"no {label} logged (no valid proposals)")
            continue
        ax.set_title(f"teacher {label}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(f"{label} (mean per step)")
        ax.grid(alpha=0.3)
        canvas.legend(ax)
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
    canvas.legend(ax)
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
    canvas.legend(ax)
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
        ax.set_ylim(*canvas.percent_limits(values))
    ax.set_title("probe accuracy at the last probe step (95 % interval over seeds)", fontsize=10)
    ax.set_xlabel("adapter")
    ax.set_ylabel("probe accuracy (%)")
    ax.grid(axis="y", alpha=0.3)
    canvas.legend(ax)
    for arm in groups:
        seeds = sorted({r.recipe.get("seed") for r in arm.runs}, key=str)
        notes.append(f"{arm.label}: {len(arm.runs)} run(s), seeds {', '.join(map(str, seeds))}")
    warnings = draw_warnings(fig, comparisons(runs))
    fig.suptitle("Arms side by side: teacher complexity, solve-rate oscillation, coverage growth, probe accuracy")
    canvas.save(fig, out_dir, "arms.png")
    return canvas.FigureOut(
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
