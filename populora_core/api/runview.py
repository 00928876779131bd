"""What a lifecycle hook sees of a run: a small, documented view, not the live run.

Hooks used to receive the loop's private ``Run``, so a plugin could come to depend on any of its attributes;
the view names the whole contract. Its population is a copy: an observer cannot change the run through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .population import Population
from .schema import Recipe


@dataclass(frozen=True)
class RunView:
    """A run as hooks see it.

    ``recipe``: the parsed recipe. ``run_dir``: the run directory. ``steps_done``: steps completed when the hook
    fires (inside step N the step hooks see N - 1 until ``on_step_end``, which sees N). ``population``: a copy of
    the members, their ratings and lineage at that moment. ``emit(records)``: append records to
    ``events.jsonl`` and to the run's metric sinks, as the loop does.
    """

    recipe: Recipe
    run_dir: Path
    steps_done: int
    population: Population
    _emit: Callable[[list[dict[str, Any]]], None] = field(repr=False)

    def emit(self, records: list[dict[str, Any]]) -> None:
        self._emit(records)
