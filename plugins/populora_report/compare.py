"""The headline of a report: what each run's students gained over the base model, and how a population run
compares with a single-agent baseline, with the checks that say whether that comparison is a fair one.

The numbers are the terminal summary's (:func:`summary.run_summary`: percent, changes in points with their
95 % paired-bootstrap intervals); the comparison adds the compute ratio and a warning for every way the two
runs differ that a difference in probe accuracy could come from instead (steps, trained tokens, base model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .data import RunData
from .summary import paired_gain_interval, run_summary

#: A population slot and the baseline's adapter count as compute-matched when their trained tokens differ by at
#: most this share (the paper's baseline gets what one slot gets); beyond it the page and the figure warn.
COMPUTE_MATCHED = 0.10


def slots(run: RunData) -> int:
    """Places in the population: the initial members (a replacement takes its place, it adds none)."""
    return len([r for r in run.lineage if r.get("operator") == "init"]) or len(run.members_final) or 1


def trained_tokens(run: RunData) -> float:
    """Tokens trained on by every member that ever lived (children start from zero, so these add up)."""
    return float(sum(c.get("trained_tokens", 0.0) for c in run.counters().values()))


def headline(run: RunData) -> dict[str, Any]:
    """The terminal summary of ``run`` (probe accuracy per student, change against the base with its interval)."""
    return run_summary(run.path)


@dataclass
class Comparison:
    """A population run against one single-agent baseline run."""

    run: str
    baseline: str
    steps: tuple[int, int]
    #: trained tokens of one population slot ÷ the baseline adapter's (1: compute-matched, the paper's design)
    per_slot_ratio: float | None
    #: trained tokens of the whole population ÷ the baseline's
    total_ratio: float | None
    #: probe accuracy of the population's best student minus the baseline agent's (same probe problems)
    best_minus_agent: float | None
    #: its 95 % paired-bootstrap interval; None when the two runs' probes do not pair problem by problem
    best_minus_agent_interval: list[float] | None
    warnings: list[str] = field(default_factory=list)


def compare(run: RunData, baseline: RunData) -> Comparison:
    """Steps, compute ratio and best student - agent of ``run`` against ``baseline``; a warning per mismatch."""
    warnings = []
    steps = (run.final_step, baseline.final_step)
    if steps[0] != steps[1]:
        warnings.append(f"different lengths: {run.label} ran {steps[0]} steps, {baseline.label} {steps[1]}")
    mine, theirs = trained_tokens(run), trained_tokens(baseline)
    per_slot = (mine / slots(run)) / (theirs / slots(baseline)) if theirs else None
    total = mine / theirs if theirs else None
    if per_slot is None:
        warnings.append(f"{baseline.label} logged no trained tokens: its compute cannot be compared")
    elif abs(per_slot - 1) > COMPUTE_MATCHED:
        warnings.append(
            f"not compute-matched: a population slot trained on {per_slot:.2f}× the tokens of the baseline's "
            f"adapter (matched is 1.00 ± {COMPUTE_MATCHED:.2f})"
        )
    bases = run.recipe.get("base_model"), baseline.recipe.get("base_model")
    if bases[0] != bases[1]:
        warnings.append(f"different base models: {bases[0]} and {bases[1]}")
    best = max(run.probe_final(), key=lambda s: s.overall, default=None)
    agent = max(baseline.probe_final(), key=lambda s: s.overall, default=None)
    gain = interval = None
    if best is not None and agent is not None:
        gain = best.overall - agent.overall
        base_a, base_b = run.probe_base(), baseline.probe_base()
        outcomes_a = run.probe_outcomes(base_a.member, base_a.step) if base_a else {}
        outcomes_b = baseline.probe_outcomes(base_b.member, base_b.step) if base_b else {}
        if outcomes_a and outcomes_a == outcomes_b:  # the same problems, scored the same by the same base
            paired = paired_gain_interval(
                run.probe_outcomes(best.member, best.step), baseline.probe_outcomes(agent.member, agent.step)
            )
            interval = None if paired is None else list(paired)
        elif outcomes_a and outcomes_b:
            warnings.append("the base model scores differently on the two runs' probes: not the same probe set")
    return Comparison(run.label, baseline.label, steps, per_slot, total, gain, interval, warnings)


def comparisons(runs: list[RunData]) -> list[Comparison]:
    """Every population run of ``runs`` against every single-agent baseline among them."""
    baselines = [r for r in runs if r.is_baseline]
    return [compare(r, b) for r in runs if not r.is_baseline for b in baselines]
