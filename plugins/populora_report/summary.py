"""What a finished run tells its user: a short table on stdout and ``summary.json`` in the run directory.

Read from the run's logs like the report, so the summary of a recorded run is the one its run printed. Every
change against the base comes with a 95 % paired-bootstrap interval over the probe problems
(:func:`paired_gain_interval`, also what ``benchmarks.research.study`` reports), so a user sees when a gain is noise,
and the best one with the smallest change this probe could detect (:func:`paired_gain_mde`). A probe with
``samples`` adds the same for per-sample accuracy.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from populora_core.services.statistics import cluster_bootstrap, cluster_mde, selection_history

from .data import load_run

LEVEL = 0.95
RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def _paired(member: dict[str, list[float]], base: dict[str, list[float]]) -> tuple[list[list[float]], list[str]]:
    """Per probe problem, [member - base], with its task type; empty when the outcomes do not pair up."""
    types = [t for t in base if t in member and len(member[t]) == len(base[t]) > 0]
    if not types or len(types) != len(base):
        return [], []
    diffs = [[m - b] for t in types for m, b in zip(member[t], base[t])]
    return diffs, [t for t in types for _ in base[t]]


def paired_gain_interval(
    member: dict[str, list[float]],
    base: dict[str, list[float]],
    *,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = LEVEL,
) -> tuple[float, float] | None:
    """Bootstrap interval (``level``, percentile) of accuracy(member) - accuracy(base) over the probe problems.

    ``member`` and ``base`` map task type -> per-problem outcomes in probe order (1/0 greedy, or a share of
    correct samples). Problems are resampled in pairs (the same problem for both, so how hard the drawn
    problems are cancels) and within each task type (the probe's strata, so every resample keeps the probe's
    mix): :func:`populora_core.services.statistics.cluster_bootstrap` with one run per problem. The statistic is the
    accuracy over all problems, which is the mean over task types when each has as many problems (the
    probe's case). Seeded: the same outcomes give the same interval. None when outcomes are missing or do
    not pair up (probe records written before they were recorded). For the best of several students the
    interval is optimistic: it does not account for picking the best after the fact.
    """
    diffs, strata = _paired(member, base)
    if not diffs:
        return None
    return cluster_bootstrap(diffs, strata=strata, resamples=resamples, seed=seed, level=level)


def paired_gain_mde(member: dict[str, list[float]], base: dict[str, list[float]]) -> float | None:
    """The smallest change (80 % power, two-sided 5 %) this paired comparison over the probe problems can
    detect, from the spread of its per-problem differences (:func:`populora_core.services.statistics.cluster_mde`)."""
    return cluster_mde(_paired(member, base)[0])


def _includes_zero(interval: tuple[float, float] | list[float] | None) -> bool | None:
    return None if interval is None else interval[0] <= 0 <= interval[1]


def run_summary(run_dir: str | Path, *, wall_s: float | None = None) -> dict[str, Any]:
    """Steps, time, children born, probe accuracy of the base and each final student, each student's change
    and best - base, each change with its 95 % paired-bootstrap interval over the probe problems.

    ``wall_s`` is the command's own time from the run's start hook to its end (a resumed run: since it
    resumed); ``step_s`` adds up every logged step's time, across resumes. An interval is None when the
    probe records carry no per-problem outcomes (runs recorded before they did).
    """
    run = load_run(run_dir)
    final = sorted(run.probe_final(), key=lambda s: -s.overall)
    base = run.probe_base()
    best = final[0].overall if final else None
    base_accuracy = base.overall if base else 0.0
    base_outcomes = run.probe_outcomes(base.member, base.step) if base else {}
    changes: dict[str, dict[str, Any]] = {}
    for student in final if base is not None else []:
        outcomes = run.probe_outcomes(student.member, student.step)
        interval = paired_gain_interval(outcomes, base_outcomes)
        changes[student.version] = {
            "change": student.overall - base_accuracy,
            "interval": None if interval is None else list(interval),
            "within_noise": _includes_zero(interval),
            "mde": paired_gain_mde(outcomes, base_outcomes),
        }
    best_change = changes.get(final[0].version) if final else None
    best_interval = best_change["interval"] if best_change else None
    return {
        "run_dir": str(run.path),
        "recipe": run.name,
        "mode": run.mode,
        "steps": run.final_step,
        "planned_steps": run.recipe.get("steps"),
        "wall_s": wall_s,
        "step_s": run.seconds()["total"],
        "children_born": len(run.children()),
        "selection": selection_history(run.lineage),
        "probe_step": final[0].step if final else None,
        "base_accuracy": base.overall if base else None,
        "students": {s.version: s.overall for s in final},
        "best_minus_base": best - base.overall if best is not None and base is not None else None,
        "report_command": f"populora report {shlex.quote(str(run.path))}",
        "base_probe_step": base.step if base else None,
        "best": final[0].version if final else None,
        "best_minus_base_interval": best_interval,
        "best_within_noise": _includes_zero(best_interval),
        "best_minus_base_mde": best_change["mde"] if best_change else None,
        "student_changes": changes,
        "probe_problems": sum(len(c) for c in base_outcomes.values()) if base_outcomes else None,
        "per_sample": _per_sample(run, final, base),
        "interval": {
            "level": LEVEL,
            "method": "paired bootstrap over the probe problems, resampled within task types (percentile)",
            "resamples": RESAMPLES,
            "seed": BOOTSTRAP_SEED,
            "best_selected_after_the_fact": True,
            "mde": "smallest change detectable at 80 % power, two-sided 5 %, paired over the probe problems",
        },
    }


def _per_sample(run: Any, final: list[Any], base: Any) -> dict[str, Any] | None:
    """Per-sample accuracy (the probe's k answers per problem) of the base and each final student, the best
    student's change with its interval and detectable change; None without sampled probe records."""
    base_shares = run.probe_outcomes(base.member, base.step, sampled=True) if base else {}
    if not base_shares:
        return None
    students = {s.version: run.probe_outcomes(s.member, s.step, sampled=True) for s in final}
    students = {v: o for v, o in students.items() if o}

    def accuracy(outcomes: dict[str, list[float]]) -> float:
        return sum(map(sum, outcomes.values())) / sum(map(len, outcomes.values()))

    accuracies = {v: accuracy(o) for v, o in sorted(students.items(), key=lambda kv: -accuracy(kv[1]))}
    best = next(iter(accuracies), None)
    interval = paired_gain_interval(students[best], base_shares) if best else None
    return {
        "samples": run.probe_samples(),
        "base_accuracy": accuracy(base_shares),
        "students": accuracies,
        "best": best,
        "best_minus_base": accuracies[best] - accuracy(base_shares) if best else None,
        "best_minus_base_interval": None if interval is None else list(interval),
        "best_within_noise": _includes_zero(interval),
        "best_minus_base_mde": paired_gain_mde(students[best], base_shares) if best else None,
    }


def write_summary(run_dir: str | Path, *, wall_s: float | None = None) -> dict[str, Any]:
    summary = run_summary(run_dir, wall_s=wall_s)
    (Path(run_dir) / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _points(gain: float, interval: list[float] | None) -> str:
    text = f"{100 * gain:+.1f} points"
    return text if interval is None else f"{text} [{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]"


def _mde(mde: float | None) -> str:
    return "" if mde is None else f"; detectable: {100 * mde:.1f} points"


def format_summary(summary: dict[str, Any]) -> str:
    """The table ``populora run`` prints when a run completes."""
    wall = "-" if summary["wall_s"] is None else f"{summary['wall_s']:.0f} s"
    rows = [
        ("steps", f"{summary['steps']}/{summary['planned_steps']}"),
        ("wall time", f"{wall} this command; the run's steps {summary['step_s']:.0f} s, every session"),
        ("children born", str(summary["children_born"])),
    ]
    selection = summary.get("selection") or {}
    if selection.get("replacements_after_first"):
        counted = selection["replacements_after_first"]
        rows.append(
            (
                "selection",
                f"{selection['youngest_replaced']} of {counted} replacements (after each role's first) hit its "
                f"youngest member (chance {selection['youngest_replaced_by_chance']:.1f}); survivors changed "
                f"{selection['survivor_changes']} of {selection['survivor_comparisons']} times",
            )
        )
    rows.append(("probe: base", _pct(summary["base_accuracy"])))
    step = summary["probe_step"]
    changes = summary.get("student_changes", {})
    accuracies = {version: f"{_pct(acc)} (step {step})" for version, acc in summary["students"].items()}
    width = max(map(len, accuracies.values()), default=0)
    for version, text in accuracies.items():
        if version in changes:  # the change against the base, in a column of its own
            change = changes[version]
            text = f"{text.ljust(width)}  {_points(change['change'], change['interval'])}"
            text += " within noise" if change["within_noise"] else ""
        rows.append((f"probe: {version}", text))
    if not summary["students"] and summary["base_accuracy"] is None:
        rows[-1] = ("probe", "not evaluated (no probe.jsonl)")
    gain, interval = summary["best_minus_base"], summary.get("best_minus_base_interval")
    if gain is None:
        best = "-"
    elif interval is None:
        best = _points(gain, None) + " (no interval: probe.jsonl has no per-problem outcomes)"
    else:
        level = round(100 * summary["interval"]["level"])
        best = f"{_points(gain, interval)} {level} % paired bootstrap over {summary['probe_problems']} probe problems"
        best += ", within noise" if summary["best_within_noise"] else ""
        best += _mde(summary.get("best_minus_base_mde"))
    rows.append(("best - base", best))
    sampled = summary.get("per_sample")
    if sampled and sampled["best"] is not None:
        text = f"base {_pct(sampled['base_accuracy'])}, {sampled['best']} {_pct(sampled['students'][sampled['best']])}"
        text += f": {_points(sampled['best_minus_base'], sampled['best_minus_base_interval'])}"
        text += " within noise" if sampled["best_within_noise"] else ""
        rows.append((f"per sample (k={sampled['samples']})", text + _mde(sampled["best_minus_base_mde"])))
    rows.append(("figures", summary["report_command"]))
    width = max(len(k) for k, _ in rows)
    head = f"{summary['recipe']} ({summary['mode']}) in {summary['run_dir']}"
    return "\n".join([head, *(f"  {k.ljust(width)}  {v}" for k, v in rows)])
