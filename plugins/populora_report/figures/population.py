"""The population: members' ratings over time and the lineage of who was born of whom."""

from __future__ import annotations

from pathlib import Path

from ..data import RunData
from . import canvas

ROLE_COLORS = {"teacher": "tab:blue", "student": "tab:orange", "both": "tab:green"}


LINEAGE_LABELS = 30  # children per run; more and the edge labels would cover the tree


def ratings(runs: list[RunData], out_dir: Path) -> canvas.FigureOut:
    from matplotlib.lines import Line2D

    fig, axes = canvas.figure(2, len(runs), 5.2, 3.2)
    notes = []
    for col, run in enumerate(runs):
        top, bottom = axes[0][col], axes[1][col]
        top.set_title(run.label, fontsize=10)
        colors = canvas.member_colors(run)
        roles = run.roles()
        drawn = 0
        for m in run.member_ids():
            xs, mu = run.member_series(m, "rating_mu")
            sx, sigma = run.member_series(m, "rating_sigma")
            if not xs:
                continue
            style = "--" if roles.get(m) == "student" else "-"
            top.plot(xs, mu, color=colors[m], lw=1.3, ls=style, label=m, gid=canvas.END_LABEL)
            if sx == xs:
                conservative = [a - 3 * b for a, b in zip(mu, sigma)]
                bottom.plot(xs, conservative, color=colors[m], lw=1.3, ls=style, label=m, gid=canvas.END_LABEL)
            drawn += 1
        if not drawn:
            canvas.empty(top, "no ratings logged")
            canvas.empty(bottom, "no ratings logged")
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
    canvas.save(fig, out_dir, "ratings.png")
    return canvas.FigureOut(
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


def lineage(runs: list[RunData], out_dir: Path) -> canvas.FigureOut:
    from matplotlib import colormaps
    from matplotlib.lines import Line2D

    lanes = {run.label: _lanes(run) for run in runs}
    tallest = max((len(v) for v in lanes.values()), default=1)
    per_lane = 0.42 if tallest <= 40 else 0.26
    fig, axes = canvas.figure(1, len(runs), 5.2, min(max(2.2, per_lane * tallest + 1.4), 60.0), sharey=False)
    operators = sorted({str(rec.get("operator", "?")) for run in runs for rec in run.children()})
    palette = colormaps["Dark2"]
    op_color = {op: palette(i % palette.N) for i, op in enumerate(operators)}
    notes = []
    for ax, run in zip(axes[0], runs):
        ax.set_title(run.label, fontsize=10)
        order = lanes[run.label]
        if not order:
            canvas.empty(ax, "no members recorded")
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
    canvas.save(fig, out_dir, "lineage.png")
    return canvas.FigureOut(
        "fig-lineage",
        "lineage.png",
        "Lineage tree with operators",
        "Each member is a lane from its birth step (dot) to its replacement (×) or the end of the run; "
        "arrows go from each parent to the child, coloured by operator and labelled with the operator and "
        f"the parent version (labels are left out for runs with more than {LINEAGE_LABELS} children).",
        "Lineage tree: members as nodes by birth step, arrows from parents to children labelled with operators",
        notes,
    )
