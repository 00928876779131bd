"""Write evaluation results: JSON, Markdown, CSV, a bar plot PNG, and a terminal table."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from .groups import GROUPS, footer

HEADERS = {
    "humaneval_plus": "HE+",
    "mbpp_plus": "MBPP+",
    "livecodebench": "LCB",
    "aime24": "AIME24",
    "aime25": "AIME25",
    "amc23": "AMC23",
    "math500": "MATH500",
    "minerva": "Minerva",
    "gsm8k": "GSM8K",
    "olympiadbench": "Olympiad",
    "humaneval": "HE",
    "mbpp": "MBPP",
    "overall": "AVG",
}


def table_rows(results: dict[str, Any]) -> list[tuple[str, dict[str, float | None]]]:
    """Rows in display order: base, members, population stats, baseline, deltas."""
    rows = [(s["label"], s["row"]) for s in results["subjects"] if s["group"] != "baseline"]
    rows += list(results["summary"].items())
    rows += [(f"Δ {name}", vals) for name, vals in results["deltas"].items()]
    return rows


def describe_dataset(ident: dict[str, Any]) -> str:
    """One line: source, hub id @ commit (or package / path), problem count, file sha256 prefixes."""
    where = {
        "hub": f"hub {ident.get('hub_id')}@{str(ident.get('revision'))[:12]}",
        "shipped": f"shipped {ident.get('package')}",
        "file": f"file {ident.get('path')}",
    }[ident["source"]]
    files = ", ".join(f"{name} sha256:{sha[:12]}" for name, sha in ident["files"].items())
    skipped = f", {ident['skipped']} unreadable records skipped" if ident.get("skipped") else ""
    return f"{where}, {ident['n_problems']} problems{skipped} ({files})"


def header(results: dict[str, Any], column: str) -> str:
    """A column's short name; a benchmark's says how many problems were used, e.g. ``AIME25 (30)``."""
    name = GROUPS[column].header if column in GROUPS else HEADERS.get(column, column)
    info = results["benchmarks"].get(column)
    return f"{name} ({info['n_items']})" if info else name


def _fmt(value: float | None, delta: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1f}" if delta else f"{value:.1f}"


def cell(results: dict[str, Any], label: str, column: str, value: float | None) -> str:
    """A table cell: the score (a Δ row: the difference) and, for a benchmark, its 95 % interval over problems."""
    delta = label.startswith("Δ ")
    text = _fmt(value, delta)
    table = results.get("delta_intervals", {}) if delta else results.get("intervals", {})
    interval = table.get(label[2:] if delta else label, {}).get(column)
    if value is None or not interval:
        return text
    lo, hi = interval
    return f"{text} [{_fmt(lo, delta)}, {_fmt(hi, delta)}]"


def markdown(results: dict[str, Any]) -> str:
    cols = results["columns"]
    lines = ["| model | " + " | ".join(header(results, c) for c in cols) + " |", "|---|" + "---|" * len(cols)]
    for label, row in table_rows(results):
        lines.append(f"| {label} | " + " | ".join(cell(results, label, c, row.get(c)) for c in cols) + " |")
    n = results["settings"]["n"]
    foot = [f"Scores in % (pass@1{'' if n == 1 else f' unbiased, n={n}'}). {footer(results['averages_of'])}"]
    if results.get("intervals"):
        foot.append(
            f"[lo, hi]: {100 * results.get('interval_level', 0.95):.0f} % bootstrap interval with problems as units "
            "(each problem resampled whole); a Δ row's pairs each problem with the reference's outcome on it."
        )
    if results.get("best_member"):
        by = ", ".join(results.get("ranked_by") or []) or "AVG"
        foot.append(
            f"Best member: {results['best_member']}; weakest: {results['weakest_member']} (by the mean score over "
            f"the benchmarks that ran: {by})."
        )
    for name, info in results["benchmarks"].items():
        too_long = info.get("too_long")
        too_long = f" ({too_long} more longer than the model's context: skipped)" if too_long else ""
        foot.append(
            f"{name}: {info['n_items']} of {info['dataset']['n_problems']} problems{too_long}, template "
            f"{info['template']}, max_tokens {info['max_tokens']}; data: {describe_dataset(info['dataset'])}"
        )
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {f}" for f in foot) + "\n"


def write_csv(results: dict[str, Any], path: Path) -> None:
    cols = results["columns"]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["model", *cols])
        for label, row in table_rows(results):
            w.writerow([label, *("" if row.get(c) is None else f"{row[c]:.4f}" for c in cols)])


def plot(results: dict[str, Any], path: Path) -> None:
    """Grouped bars per benchmark: base, members (up to 8), population mean, baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [c for c in results["columns"]]
    series = [(s["label"], s["row"]) for s in results["subjects"] if s["group"] == "base"]
    members = [(s["label"], s["row"]) for s in results["subjects"] if s["group"] in ("population", "adapter")]
    if len(members) <= 8:
        series += members
    for name in ("population mean", "baseline"):
        if name in results["summary"]:
            series.append((name, results["summary"][name]))
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(cols)), 4.0))
    for i, (label, row) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(cols))]
        ax.bar(xs, [row.get(c) or 0.0 for c in cols], width, label=label)
    if "population best" in results["summary"] and "population mean" in results["summary"]:
        mean, best = results["summary"]["population mean"], results["summary"]["population best"]
        worst = results["summary"]["population weakest"]
        i = [lbl for lbl, _ in series].index("population mean")
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(cols))]
        ys = [mean.get(c) or 0.0 for c in cols]
        lo = [max(0.0, y - (worst.get(c) or 0.0)) for y, c in zip(ys, cols)]
        hi = [max(0.0, (best.get(c) or 0.0) - y) for y, c in zip(ys, cols)]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="none", ecolor="black", capsize=2, linewidth=0.8)
    top = max(
        [0.0]
        + [row.get(c) or 0.0 for _, row in series for c in cols]
        + [results["summary"].get("population best", {}).get(c) or 0.0 for c in cols]
    )
    ax.set_ylim(0.0, min(100.0, max(1.0, top * 1.15)) if top <= 100.0 else top * 1.05)
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels([HEADERS.get(c, c) for c in cols], rotation=30, ha="right")
    ax.set_ylabel("score (%)")
    ax.set_title("PopuLoRA evaluation" + (" (whiskers: weakest..best member)" if members else ""))
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_all(results: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "results.json",
        "markdown": out_dir / "results.md",
        "csv": out_dir / "results.csv",
        "png": out_dir / "results.png",
    }
    paths["json"].write_text(json.dumps(results, indent=1, default=str))
    paths["markdown"].write_text(markdown(results))
    write_csv(results, paths["csv"])
    plot(results, paths["png"])
    return paths


def print_table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    cols = results["columns"]
    table = Table(title="PopuLoRA evaluation (%)")
    table.add_column("model")
    for c in cols:
        table.add_column(header(results, c), justify="right")
    for label, row in table_rows(results):
        table.add_row(label, *(cell(results, label, c, row.get(c)) for c in cols))
    console = Console(width=max(100, 20 * (len(cols) + 2)))
    console.print(table)
    if results.get("best_member"):
        by = ", ".join(results.get("ranked_by") or []) or "AVG"
        console.print(f"best member: {results['best_member']}, weakest: {results['weakest_member']} (mean over {by})")
