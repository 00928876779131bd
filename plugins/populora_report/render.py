"""Assemble the report: PNGs, a summary table (also as JSON) and one self-contained HTML page."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from populora_core import UserError

from . import dynamics
from .data import COUNTERS, RunData, arms, load_runs
from .figures import FIGURES, FigureOut


def summarize(run: RunData, baselines: list[RunData]) -> dict[str, Any]:
    """One row of the summary table (JSON-friendly, the study script can read summary.json)."""
    roles = run.roles()
    alive = run.members_final
    final = run.probe_final()
    base = run.probe_base()
    accs = [s.overall for s in final]
    counters = run.counters()
    totals = {k: sum(c.get(k, 0) for c in counters.values()) for k in COUNTERS}
    row: dict[str, Any] = {
        "run": run.label,
        "path": str(run.path),
        "recipe": run.name,
        "mode": run.mode,
        "final_step": run.final_step,
        "planned_steps": run.recipe.get("steps"),
        "members": len(alive),
        "teachers": sum(1 for m in alive if m.get("role") in ("teacher", "both")),
        "students": sum(1 for m in alive if m.get("role") in ("student", "both")),
        "members_ever": len(roles),
        "children_born": len(run.children()),
        "probe_step": final[0].step if final else None,
        "probe_mean": sum(accs) / len(accs) if accs else None,
        "probe_best": max(accs) if accs else None,
        "probe_weakest": min(accs) if accs else None,
        "probe_best_member": max(final, key=lambda s: s.overall).version if final else None,
        "base_accuracy": base.overall if base else None,
        "counters_total": totals,
        "counters_per_member": counters,
        "seconds": run.seconds(),
        "notes": list(run.notes),
    }
    if row["probe_best"] is not None and row["base_accuracy"] is not None:
        row["best_minus_base"] = row["probe_best"] - row["base_accuracy"]
    probed = [b for b in baselines if b is not run and b.probe_final()]
    if probed and not run.is_baseline:
        agents = [s.overall for b in probed for s in b.probe_final()]
        row["baseline_accuracy"] = sum(agents) / len(agents)
    row["slots"] = slots = _slots(run)
    row["trained_tokens_per_slot"] = totals["trained_tokens"] / slots
    refs = [b for b in baselines if b is not run]
    if refs and not run.is_baseline:
        # The paper's baseline is compute-matched per adapter: one adapter gets what each population slot gets.
        ref = [sum(c.get("trained_tokens", 0.0) for c in b.counters().values()) / _slots(b) for b in refs]
        mean_ref = sum(ref) / len(ref)
        row["per_slot_vs_baseline"] = row["trained_tokens_per_slot"] / mean_ref if mean_ref else None
    return row


def _slots(run: RunData) -> int:
    return len([r for r in run.lineage if r.get("operator") == "init"]) or len(run.members_final) or 1


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1500px;
color:#222;padding:0 16px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:0.85em;margin:8px 0}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td.l,th.l{text-align:left}figure{margin:8px 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:0.9em;color:#444;margin-top:4px}.note{color:#8a5a00;font-size:0.88em}
details{margin:6px 0}summary{cursor:pointer}
"""


def _summary_table(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("run", "run", True),
        ("mode", "mode", True),
        ("final_step", "final step", False),
        ("members", "members (end)", False),
        ("children_born", "children born", False),
        ("probe_step", "probe step", False),
        ("probe_mean", "mean student probe acc.", False),
        ("probe_best", "best student", False),
        ("probe_weakest", "weakest student", False),
        ("base_accuracy", "base acc.", False),
        ("best_minus_base", "best − base", False),
        ("baseline_accuracy", "baseline acc.", False),
        ("trained_tokens_per_slot", "trained tokens / slot", False),
        ("per_slot_vs_baseline", "per slot ÷ baseline", False),
    ]
    head = "".join(f'<th class="{"l" if left else ""}">{_e(title)}</th>' for _, title, left in cols)
    body = []
    for row in rows:
        cells = []
        for key, _, left in cols:
            value = row.get(key)
            if key == "members" and value is not None:
                value = f"{row['members']} ({row['teachers']}T/{row['students']}S)"
            digits = 0 if key == "trained_tokens_per_slot" else 2 if key == "per_slot_vs_baseline" else 3
            cells.append(f'<td class="{"l" if left else ""}">{_e(_fmt(value, digits))}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table id="summary-table"><tr>{head}</tr>{"".join(body)}</table>'


def _counters_table(run: RunData, row: dict[str, Any]) -> str:
    roles = run.roles()
    alive = {m["id"] for m in run.members_final}
    head = "<th class='l'>member</th><th class='l'>role</th><th class='l'>status</th>" + "".join(
        f"<th>{_e(k)}</th>" for k in COUNTERS
    )
    body = []
    for member, counters in row["counters_per_member"].items():
        status = "alive" if member in alive else "replaced" if member in run.deaths() else "—"
        cells = "".join(f"<td>{_e(_fmt(counters.get(k)))}</td>" for k in COUNTERS)
        body.append(
            f"<tr><td class='l'>{_e(member)}</td><td class='l'>{_e(roles.get(member, '?'))}</td>"
            f"<td class='l'>{status}</td>{cells}</tr>"
        )
    totals = "".join(f"<th>{_e(_fmt(row['counters_total'][k]))}</th>" for k in COUNTERS)
    body.append(f"<tr><th class='l' colspan='3'>total</th>{totals}</tr>")
    secs = row["seconds"]
    return (
        f"<details open><summary>Compute counters — {_e(run.label)} "
        f"(wall {secs['total']:.1f}s, model {secs['model']:.1f}s)</summary>"
        f"<table class='counters'><tr>{head}</tr>{''.join(body)}</table></details>"
    )


def _lineage_table(run: RunData) -> str:
    children = run.children()
    if not children:
        return ""
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='l'>{_e(v)}</td>"
            for v in (
                rec.get("step"),
                rec.get("child"),
                ", ".join(map(str, rec.get("parents", []))),
                rec.get("operator"),
                json.dumps(rec.get("params", {}), sort_keys=True),
                rec.get("replaced", ""),
            )
        )
        + "</tr>"
        for rec in children
    )
    head = "".join(f"<th class='l'>{h}</th>" for h in ("step", "child", "parents", "operator", "params", "replaced"))
    return (
        f"<details><summary>Evolution events — {_e(run.label)} ({len(children)})</summary>"
        f"<table><tr>{head}</tr>{body}</table></details>"
    )


MEASURES = (
    ("complexity_slope/ast_depth", "AST depth / step", 4),
    ("complexity_slope/cyclomatic", "cyclomatic / step", 4),
    ("complexity_slope/loc", "LOC / step", 4),
    ("oscillation/swings", "solve-rate swings", 1),
    ("oscillation/amplitude", "swing amplitude", 3),
    ("coverage/new_per_step", "new signatures / step (last third)", 2),
    ("coverage/new_per_valid_proposal", "new / valid proposal (last third)", 3),
    ("probe/base", "probe: base", 3),
    ("probe/mean", "probe: students' mean", 3),
    ("probe/best", "probe: best", 3),
    ("probe/weakest", "probe: weakest", 3),
)


def dynamics_rows(runs: list[RunData]) -> list[dict[str, Any]]:
    """Per arm (runs differing only in seed): each run's dynamics measures and their pooled interval."""
    out = []
    for arm in arms(runs):
        per_run = {r.label: r.measures() for r in arm.runs}
        out.append({"arm": arm.label, "runs": per_run, "pooled": dynamics.pool(list(per_run.values()))})
    return out


def _stat(stat: dict[str, Any], digits: int) -> str:
    if stat["mean"] is None:
        return "—"
    text = f"{stat['mean']:.{digits}f}"
    return text if stat["low"] is None else f"{text} [{stat['low']:.{digits}f}, {stat['high']:.{digits}f}]"


def _dynamics_table(rows: list[dict[str, Any]]) -> str:
    head = "<th class='l'>arm</th><th>runs</th>" + "".join(f"<th>{_e(title)}</th>" for _, title, _ in MEASURES)
    body = "".join(
        f"<tr><td class='l'>{_e(row['arm'])}</td><td>{len(row['runs'])}</td>"
        + "".join(f"<td>{_e(_stat(row['pooled'][key], digits))}</td>" for key, _, digits in MEASURES)
        + "</tr>"
        for row in rows
    )
    per_run = "".join(
        f"<tr><td class='l'>{_e(label)}</td><td>1</td>"
        + "".join(f"<td>{_e(_fmt(values[key], digits))}</td>" for key, _, digits in MEASURES)
        + "</tr>"
        for row in rows
        for label, values in row["runs"].items()
    )
    return (
        f"<table id='dynamics-table'><tr>{head}</tr>{body}</table>"
        f"<details><summary>Per run</summary><table><tr>{head}</tr>{per_run}</table></details>"
    )


def _figure_html(fig: FigureOut, out_dir: Path) -> str:
    data = base64.b64encode((out_dir / fig.file).read_bytes()).decode("ascii")
    notes = "".join(f"<li>{_e(n)}</li>" for n in fig.notes)
    return (
        f'<section id="{fig.id}"><h2>{_e(fig.title)}</h2>'
        f'<figure><img id="{fig.id}-img" alt="{_e(fig.alt)}" title="{_e(fig.title)}" '
        f'src="data:image/png;base64,{data}">'
        f"<figcaption>{_e(fig.caption)} (<code>{_e(fig.file)}</code>)</figcaption></figure>"
        + (f'<ul class="note">{notes}</ul>' if notes else "")
        + "</section>"
    )


def render_report(run_dirs: list[str | Path], out: str | Path | None = None) -> Path:
    """Write the PNGs, summary.json and report.html into ``out``; return the HTML file's path."""
    runs = load_runs(list(run_dirs))
    out_dir = Path(out) if out is not None else (runs[0].path / "report" if len(runs) == 1 else Path("report"))
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir} exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = [make(runs, out_dir) for make in FIGURES]
    baselines = [r for r in runs if r.is_baseline]
    rows = [summarize(r, baselines) for r in runs]
    (out_dir / "summary.json").write_text(json.dumps(rows, indent=1, default=str))
    measured = dynamics_rows(runs)
    (out_dir / "dynamics.json").write_text(json.dumps(measured, indent=1))

    run_notes = "".join(
        f"<li><b>{_e(r.label)}</b> (<code>{_e(r.path)}</code>, {_e(r.mode)}"
        + (", the single-agent baseline" if r.is_baseline else "")
        + ")"
        + (": " + _e("; ".join(r.notes)) if r.notes else "")
        + "</li>"
        for r in runs
    )
    title = "PopuLoRA report — " + ", ".join(r.label for r in runs)
    page = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1><ul id='runs'>{run_notes}</ul>"
        "<section id='summary'><h2>Summary</h2>"
        + _summary_table(rows)
        + "<p class='note'>Probe accuracies are n-weighted over task types at the last probe step; "
        "“best − base” is the issue's target quantity. Compute counters add up every member "
        "that ever lived (children start from zero); a slot is one place in the population, and the "
        "baseline is compute-matched when its adapter's trained tokens equal a slot's (ratio ≈ 1).</p>"
        + "<h2>Dynamics per arm</h2>"
        + _dynamics_table(measured)
        + "<p class='note'>Mean over an arm's runs (runs whose recipes differ only in seed) with the 95 % "
        "t-interval over seeds. Slopes: least-squares slope per step of the per-step mean over the valid programs "
        "the teachers wrote (deduction and abduction; induction's come from the buffers). "
        "Swings: changes between excursions of the detrended 5-step mean solve rate beyond ±h (3 standard errors "
        "of a window mean of the step-to-step noise, at least 0.01), amplitude peak to trough. New signatures: "
        "task signatures of valid proposals first seen at a step, in the last third of the run. Probe: "
        "n-weighted over task types at the last probe step.</p>"
        + "".join(_counters_table(r, row) for r, row in zip(runs, rows))
        + "".join(_lineage_table(r) for r in runs)
        + "</section>"
        + "".join(_figure_html(f, out_dir) for f in figures)
        + "</body></html>\n"
    )
    html_file = out_dir / "report.html"
    html_file.write_text(page, encoding="utf-8")
    return html_file
