"""Spreading one call's items: :func:`split_by_cost` over workers or parallel runs, :func:`per_task` by the task
each item belongs to. Plain Python.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from ..api.tasks import Task

T = TypeVar("T")


def split_by_cost(costs: Sequence[float], parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` ranges of ``costs``, at most ``parts`` and none empty, each near an equal
    share of the total (a call's requests over workers, or over parallel decode runs).

    A row goes to the part that holds the middle of its cost; a middle exactly on a boundary goes to the
    earlier part (``<=``: either choice is equally even, this one is the hf engine's, whose runs it keeps).
    """
    total, bounds, running, start = sum(costs), [], 0.0, 0
    for part in range(1, parts):
        goal = total * part / parts
        end = start
        while end < len(costs) and running + costs[end] / 2 <= goal:
            running += costs[end]
            end += 1
        if end > start:
            bounds.append((start, end))
            start = end
    if start < len(costs):
        bounds.append((start, len(costs)))
    return bounds


def per_task(
    tasks: Mapping[str, Task], task_names: Sequence[str | None], batch: Callable[[Task, list[int]], Sequence[T]]
) -> list[T]:
    """``batch(task, indices)`` once per task over the indices of its items (``None``: no task, left out),
    tasks in the order first met; the results come back in input order (a left-out item's is None)."""
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, task_name in enumerate(task_names):
        if task_name is not None:
            by_task[task_name].append(i)
    out: list[T] = [None] * len(task_names)  # type: ignore[list-item]
    for task_name, idx in by_task.items():
        for i, result in zip(idx, batch(tasks[task_name], idx), strict=True):
            out[i] = result
    return out
