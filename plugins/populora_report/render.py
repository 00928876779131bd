"""Assemble the report: PNGs, a summary table (also as JSON) and one self-contained HTML page."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from populora_core.api import UserError
from populora_core.services.files import atomic_dir, remove_stale

from . import dynamics
from .compare import COMPUTE_MATCHED, Comparison, comparisons, headline, slots
from .data import COUNTERS, RunData, arms, load_runs
from .figures import FIGURES
from .figures.canvas import FigureOut
from .summary import _pct, _points


def summarize(run: RunData, baselines: list[RunData], head: dict[str, Any]) -> dict[str, Any]:
    """One row of the summary table (JSON-friendly, the study script can read summary.json); ``head`` is the run's
    terminal summary, whose changes against the base and their intervals the row repeats."""
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
    for key in ("student_changes", "best_minus_base_interval", "best_within_noise", "probe_problems"):
        row[key] = head[key]
    probed = [b for b in baselines if b is not run and b.probe_final()]
    if probed and not run.is_baseline:
        agents = [s.overall for b in probed for s in b.probe_final()]
        row["baseline_accuracy"] = sum(agents) / len(agents)
    row["slots"] = slots(run)
    row["trained_tokens_per_slot"] = totals["trained_tokens"] / row["slots"]
    refs = [b for b in baselines if b is not run]
    if refs and not run.is_baseline:
        # The paper's baseline is compute-matched per adapter: one adapter gets what each population slot gets.
        ref = [sum(c.get("trained_tokens", 0.0) for c in b.counters().values()) / slots(b) for b in refs]
        mean_ref = sum(ref) / len(ref)
        row["per_slot_vs_baseline"] = row["trained_tokens_per_slot"] / mean_ref if mean_ref else None
    return row


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
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}td{white-space:nowrap}th{background:#f3f3f3}
td.l,th.l{text-align:left}figure{margin:8px 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:0.9em;color:#444;margin-top:4px}.note{color:#555;font-size:0.88em}
details{margin:6px 0}summary{cursor:pointer}caption{text-align:left;font-weight:600;padding:4px 0}
table.headline{display:inline-table;margin-right:24px;vertical-align:top}tr.best td{font-weight:600;background:#f7f7f7}
.warn{border:2px solid #b00020;background:#fff4f4;color:#7a0016;padding:6px 12px;margin:8px 0;max-width:1100px}
h3{font-size:1.05em;margin-top:1.2em}
"""


PERCENT = ("probe_mean", "probe_best", "probe_weakest", "base_accuracy", "baseline_accuracy")


def _summary_cell(row: dict[str, Any], key: str) -> str:
    """A summary table cell in the terminal summary's units: accuracies in %, changes in points [interval]."""
    value = row.get(key)
    if value is None:
        return "—"
    if key in PERCENT:
        return _pct(value)
    if key == "best_minus_base":
        return _points(value, row.get("best_minus_base_interval"))
    if key == "members":
        return f"{row['members']} ({row['teachers']}T/{row['students']}S)"
    if key == "per_slot_vs_baseline":
        return _ratio(value)
    return _fmt(value, 0)


def _summary_table(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("run", "run", True),
        ("mode", "mode", True),
        ("final_step", "final step", False),
        ("members", "members (end)", False),
        ("children_born", "children born", False),
        ("probe_step", "probe step", False),
        ("base_accuracy", "base", False),
        ("probe_mean", "students' mean", False),
        ("probe_best", "best student", False),
        ("probe_weakest", "weakest student", False),
        ("best_minus_base", "best − base (points, 95 % interval)", False),
        ("baseline_accuracy", "single agent", False),
        ("trained_tokens_per_slot", "trained tokens / slot", False),
        ("per_slot_vs_baseline", "per slot ÷ baseline", False),
    ]
    head = "".join(f'<th class="{"l" if left else ""}">{_e(title)}</th>' for _, title, left in cols)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"l" if left else ""}">{_e(_summary_cell(row, key))}</td>' for key, _, left in cols)
        + "</tr>"
        for row in rows
    )
    return f'<table id="summary-table"><tr>{head}</tr>{body}</table>'


def _headline_table(run: RunData, head: dict[str, Any]) -> str:
    """Base, every final student (best first) and best − base: probe accuracy and change in points [interval]."""
    if head["base_accuracy"] is None and not head["students"]:
        return f"<p><b>{_e(run.label)}</b>: no probe evaluation (no probe.jsonl), so no result to show.</p>"
    rows = [("base", _pct(head["base_accuracy"]), "", "")]
    for version, accuracy in head["students"].items():
        change = head["student_changes"].get(version)
        if change is None:
            rows.append((version, _pct(accuracy), "— (no base probe)", ""))
        else:
            rows.append(
                (version, _pct(accuracy), _points(change["change"], change["interval"]), _noise(change["within_noise"]))
            )
    if head["best_minus_base"] is not None:
        gain = _points(head["best_minus_base"], head["best_minus_base_interval"])
        rows.append(("best − base", "", gain, _noise(head["best_within_noise"])))
    body = "".join(
        f"<tr class='{'best' if name == 'best − base' else ''}'><td class='l'>{_e(name)}</td><td>{_e(acc)}</td>"
        f"<td>{_e(change)}</td><td class='l'>{_e(noise)}</td></tr>"
        for name, acc, change, noise in rows
    )
    problems = f", {head['probe_problems']} problems" if head["probe_problems"] else ""
    return (
        f"<table class='headline'><caption>{_e(run.label)}: probe at step {_e(head['probe_step'])}{_e(problems)}"
        "</caption><tr><th class='l'>adapter</th><th>probe accuracy</th>"
        "<th>change against the base (points, 95 % interval)</th><th class='l'></th></tr>"
        f"{body}</table>"
    )


def _noise(within: bool | None) -> str:
    return {True: "within noise", False: "beyond noise", None: "no interval (no per-problem outcomes)"}[within]


def _comparison_table(found: list[Comparison]) -> str:
    """Population runs against single-agent baselines: steps, compute ratio, best student − agent, warnings."""
    if not found:
        return ""
    head = "".join(
        f"<th class='l'>{h}</th>" if i < 2 else f"<th>{h}</th>"
        for i, h in enumerate(
            (
                "population run",
                "single-agent run",
                "steps",
                "trained tokens per slot ÷ baseline's adapter",
                "whole population ÷ baseline",
                "best student − single agent (points, 95 % interval)",
            )
        )
    )
    body = "".join(
        f"<tr><td class='l'>{_e(c.run)}</td><td class='l'>{_e(c.baseline)}</td>"
        f"<td>{c.steps[0]} vs {c.steps[1]}</td><td>{_e(_ratio(c.per_slot_ratio))}</td>"
        f"<td>{_e(_ratio(c.total_ratio))}</td>"
        f"<td>{_e('—' if c.best_minus_agent is None else _points(c.best_minus_agent, c.best_minus_agent_interval))}"
        "</td></tr>"
        for c in found
    )
    warnings = "".join(f"<li>{_e(c.run)} vs {_e(c.baseline)}: {_e(w)}</li>" for c in found for w in c.warnings)
    return (
        "<h3>Population vs single agent</h3>"
        f"<table id='comparison-table'><tr>{head}</tr>{body}</table>"
        + (
            "<div class='warn' id='comparison-warnings'><b>Not a like-for-like comparison</b>: a difference in "
            f"probe accuracy may come from these instead of the method.<ul>{warnings}</ul></div>"
            if warnings
            else "<p class='note'>Same steps, compute-matched (a population slot trains on as many tokens as the "
            f"single agent's adapter, within {round(100 * COMPUTE_MATCHED)} %), same base model.</p>"
        )
        + "<p class='note'>Best student − single agent pairs the two adapters' outcomes on the same probe problems "
        "(only when both runs probed the same problems with the same base); like best − base it is picked after "
        "the fact.</p>"
    )


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


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
    ("probe/base", "probe: base (%)", 1),
    ("probe/mean", "probe: students' mean (%)", 1),
    ("probe/best", "probe: best (%)", 1),
    ("probe/weakest", "probe: weakest (%)", 1),
)


def _scaled(key: str, value: Any) -> Any:
    """Probe accuracies in percent, as everywhere else on the page."""
    return 100 * value if key.startswith("probe/") and value is not None else value


def dynamics_rows(runs: list[RunData]) -> list[dict[str, Any]]:
    """Per arm (runs differing only in seed): each run's dynamics measures and their pooled interval."""
    out = []
    for arm in arms(runs):
        per_run = {r.label: r.measures() for r in arm.runs}
        out.append({"arm": arm.label, "runs": per_run, "pooled": dynamics.pool(list(per_run.values()))})
    return out


def _stat(key: str, stat: dict[str, Any], digits: int) -> str:
    if stat["mean"] is None:
        return "—"
    mean, low, high = (_scaled(key, stat[k]) for k in ("mean", "low", "high"))
    text = f"{mean:.{digits}f}"
    return text if low is None else f"{text} [{low:.{digits}f}, {high:.{digits}f}]"


def _dynamics_table(rows: list[dict[str, Any]]) -> str:
    head = "<th class='l'>arm</th><th>runs</th>" + "".join(f"<th>{_e(title)}</th>" for _, title, _ in MEASURES)
    body = "".join(
        f"<tr><td class='l'>{_e(row['arm'])}</td><td>{len(row['runs'])}</td>"
        + "".join(f"<td>{_e(_stat(key, row['pooled'][key], digits))}</td>" for key, _, digits in MEASURES)
        + "</tr>"
        for row in rows
    )
    per_run = "".join(
        f"<tr><td class='l'>{_e(label)}</td><td>1</td>"
        + "".join(f"<td>{_e(_fmt(_scaled(key, values[key]), digits))}</td>" for key, _, digits in MEASURES)
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
    warnings = "".join(f"<li>{_e(w)}</li>" for w in fig.warnings)
    return (
        f'<section id="{fig.id}"><h2>{_e(fig.title)}</h2>'
        f'<figure><img id="{fig.id}-img" alt="{_e(fig.alt)}" title="{_e(fig.title)}" '
        f'src="data:image/png;base64,{data}">'
        f"<figcaption>{_e(fig.caption)} (<code>{_e(fig.file)}</code>)</figcaption></figure>"
        + (f'<ul class="note">{notes}</ul>' if notes else "")
        + (f'<div class="warn"><ul>{warnings}</ul></div>' if warnings else "")
        + "</section>"
    )


def render_report(run_dirs: list[str | Path], out: str | Path | None = None) -> Path:
    """Write the PNGs, summary.json, dynamics.json and report.html into ``out``; return the HTML file's path.

    They are written into a hidden folder beside ``out`` that then takes its place, so a render killed midway
    leaves the previous report whole (never a new figure beside an old page); what such a kill left behind is
    removed by the next render. ``out`` is the report's own folder: one holding other files is refused."""
    runs = load_runs(list(run_dirs))
    out_dir = Path(out) if out is not None else (runs[0].path / "report" if len(runs) == 1 else Path("report"))
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir} exists and is not a directory")
    foreign = sorted(p.name for p in out_dir.iterdir() if not _report_file(p)) if out_dir.is_dir() else []
    if foreign:
        raise UserError(
            f"--out {out_dir} holds files a report does not write ({', '.join(foreign[:5])}): the report replaces "
            "its folder as one set, so choose a new folder (or the report's own)"
        )
    remove_stale(out_dir)
    with atomic_dir(out_dir, replace=out_dir.exists()) as tmp:
        _render(runs, tmp)
    return out_dir / "report.html"


def _report_file(path: Path) -> bool:
    return path.is_file() and path.suffix in (".png", ".json", ".html")


def _render(runs: list[RunData], out_dir: Path) -> None:
    figures = [fig for fig in (make(runs, out_dir) for make in FIGURES) if fig is not None]  # None: nothing to draw
    baselines = [r for r in runs if r.is_baseline]
    heads = [headline(r) for r in runs]
    rows = [summarize(r, baselines, head) for r, head in zip(runs, heads)]
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
        "<section id='headline'><h2>Result: probe accuracy against the base model</h2>"
        + "".join(_headline_table(r, head) for r, head in zip(runs, heads))
        + "<p class='note'>Probe accuracy: greedy, on the held-out probe problems, n-weighted over task types at "
        "the last probe step (the numbers <code>populora run</code> prints at the end). A change is in points "
        "(1 point = 1 % of the probe problems) with its 95 % paired-bootstrap interval over the probe problems; "
        "“within noise”: the interval includes 0. Best − base is the best student's change, chosen after the "
        "fact on these same problems: biased upwards, its interval too narrow; the students' mean is not picked.</p>"
        + _comparison_table(comparisons(runs))
        + "".join(_figure_html(f, out_dir) for f in figures if f.id == "fig-headline")  # the answer, drawn
        + "</section>"
        "<section id='summary'><h2>Summary</h2>"
        + _summary_table(rows)
        + "<p class='note'>Compute counters add up every member "
        "that ever lived (children start from zero); a slot is one place in the population, and the "
        "baseline is compute-matched when its adapter's trained tokens equal a slot's (ratio ≈ 1).</p>"
        + "<h2>Dynamics per arm</h2>"
        + _dynamics_table(measured)
        + "<p class='note'>Mean over an arm's runs (runs whose recipes differ only in seed) with the 95 % "
        "t-interval over seeds. Slopes: least-squares slope per step of the per-step mean over the valid programs "
        "the teachers wrote (a task marks the others: AZR's induction takes its programs from the buffers). "
        "Swings: changes between excursions of the detrended 5-step mean solve rate beyond ±h (3 standard errors "
        "of a window mean of the step-to-step noise, at least 0.01), amplitude peak to trough. New signatures: "
        "task signatures of valid proposals first seen at a step, in the last third of the run. Probe: "
        "n-weighted over task types at the last probe step.</p>"
        + "".join(_counters_table(r, row) for r, row in zip(runs, rows))
        + "".join(_lineage_table(r) for r in runs)
        + "</section>"
        + "".join(_figure_html(f, out_dir) for f in figures if f.id != "fig-headline")
        + "</body></html>\n"
    )
    (out_dir / "report.html").write_text(page, encoding="utf-8")
