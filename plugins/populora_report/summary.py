"""What a finished run tells its user: a short table on stdout and ``summary.json`` in the run directory.

Read from the run's logs like the report, so the summary of a recorded run is the one its run printed.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from .data import load_run


def run_summary(run_dir: str | Path, *, wall_s: float | None = None) -> dict[str, Any]:
    """Steps, time, children born, probe accuracy of the base and each final student, best - base.

    ``wall_s`` is the command's own time from the run's start hook to its end (a resumed run: since it
    resumed); ``step_s`` adds up every logged step's time, across resumes.
    """
    run = load_run(run_dir)
    final = sorted(run.probe_final(), key=lambda s: -s.overall)
    base = run.probe_base()
    best = final[0].overall if final else None
    return {
        "run_dir": str(run.path),
        "recipe": run.name,
        "mode": run.mode,
        "steps": run.final_step,
        "planned_steps": run.recipe.get("steps"),
        "wall_s": wall_s,
        "step_s": run.seconds()["total"],
        "children_born": len(run.children()),
        "probe_step": final[0].step if final else None,
        "base_accuracy": base.overall if base else None,
        "students": {s.version: s.overall for s in final},
        "best_minus_base": best - base.overall if best is not None and base is not None else None,
        "report_command": f"populora report {shlex.quote(str(run.path))}",
    }


def write_summary(run_dir: str | Path, *, wall_s: float | None = None) -> dict[str, Any]:
    summary = run_summary(run_dir, wall_s=wall_s)
    (Path(run_dir) / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def format_summary(summary: dict[str, Any]) -> str:
    """The table ``populora run`` prints when a run completes."""
    wall = "-" if summary["wall_s"] is None else f"{summary['wall_s']:.0f} s"
    rows = [
        ("steps", f"{summary['steps']}/{summary['planned_steps']}"),
        ("wall time", f"{wall} (steps {summary['step_s']:.0f} s)"),
        ("children born", str(summary["children_born"])),
        ("probe: base", _pct(summary["base_accuracy"])),
    ]
    step = summary["probe_step"]
    rows += [(f"probe: {version}", f"{_pct(acc)} (step {step})") for version, acc in summary["students"].items()]
    if not summary["students"] and summary["base_accuracy"] is None:
        rows[-1] = ("probe", "not evaluated (no probe.jsonl)")
    gain = summary["best_minus_base"]
    rows.append(("best - base", "-" if gain is None else f"{100 * gain:+.1f} points"))
    rows.append(("figures", summary["report_command"]))
    width = max(len(k) for k, _ in rows)
    head = f"{summary['recipe']} ({summary['mode']}) in {summary['run_dir']}"
    return "\n".join([head, *(f"  {k.ljust(width)}  {v}" for k, v in rows)])
