"""What every figure of the report draws with: a matplotlib ``Figure`` on the Agg canvas (never pyplot, so rendering
touches no global backend state and works headless), its PNG, legends or line-end labels, member colours,
smoothing and percent axes. Kept apart from the figures so each figure module holds only what it shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data import RunData

SMOOTH_ABOVE = 30  # steps; longer runs get a trailing mean so per-member lines stay readable


MAX_LEGEND = 14


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


def figure(rows: int, cols: int, width: float, height: float, sharey: bool = True) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(width, 8.0 if cols == 1 else 5.5) * cols, height * rows), layout="constrained", dpi=100)
    axes = fig.subplots(rows, cols, squeeze=False, sharey="row" if sharey else False)
    return fig, axes


def save(fig: Any, out_dir: Path, name: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    label_ends(fig)
    fig.savefig(out_dir / name, format="png")


END_LABEL = "end-label"  # gid of a line to be named at its last point instead of in the legend


def label_ends(fig: Any, fontsize: float = 7.0) -> None:
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


def empty(ax: Any, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="0.35", wrap=True)
    ax.axis("off")  # not set_xticks([]): axes share their y-axis within a row


def legend(ax: Any, run: RunData | None = None, *, outside: bool = False) -> None:
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


def smooth(ys: list[float], n_steps: int) -> list[float]:
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


def marker(n_points: int) -> str | None:
    return "o" if n_points <= 30 else None


def plot_members(ax: Any, run: RunData, members: list[str], metric: str, colors: dict[str, Any]) -> int:
    drawn = 0
    for m in members:
        xs, ys = run.member_series(m, metric)
        if not xs:
            continue
        ax.plot(xs, smooth(ys, run.final_step), label=m, color=colors[m], lw=1.2, marker=marker(len(xs)), ms=3)
        drawn += 1
    return drawn


def percent_limits(values: list[float], min_span: float = 6.0) -> tuple[float, float]:
    """Limits of an axis in percent (or points) around ``values``, padded, at least ``min_span`` wide: an axis
    from 0 to 100 would flatten the one or two points by which adapters differ on a probe of a few dozen problems."""
    lo, hi = min(values), max(values)
    pad = max(1.0, 0.12 * (hi - lo))
    lo, hi = lo - pad, hi + pad
    if hi - lo < min_span:
        mid = (lo + hi) / 2
        lo, hi = mid - min_span / 2, mid + min_span / 2
    return lo, hi
