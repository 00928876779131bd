"""The paper's figures as PNGs, one panel per run side by side, and ``FIGURES``: every figure a report draws, in the
page's order. One module per family of figures, each reading its own part of the logs (training curves, difficulty,
proposals, population, evaluation, arms), and ``canvas`` for what they all draw with; matplotlib is imported inside
functions. A figure is a function ``(runs, out_dir) -> FigureOut | None`` (None: nothing to draw, as for difficulty
without levels) that saves its PNG into ``out_dir``."""

from __future__ import annotations

from .arms import arm_views
from .difficulty import difficulty, solve_rate_by_level
from .evaluation import headline, probe
from .population import lineage, ratings
from .proposals import proposals, references
from .training import complexity, coverage, solve_rates

FIGURES = (
    headline,
    arm_views,
    solve_rates,
    complexity,
    difficulty,
    solve_rate_by_level,
    proposals,
    references,
    coverage,
    ratings,
    lineage,
    probe,
)
