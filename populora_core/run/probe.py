"""A run's probe: its held-out probe set and the probe records of its students (the loop calls :func:`evaluate`
before the first step and after the last); the evaluation itself is :mod:`populora_core.services.probe`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..api.components import Problem, SamplingParams
from ..api.errors import UserError
from ..api.population import Member
from ..services.probe import ProbeTarget, probe_records, probe_set
from .assembly import Components


def run_probe_set(c: Components) -> dict[str, list[Problem]]:
    """A run's held-out probe set per task type: the recipe's file, else the one shipped with the base."""
    cfg = c.recipe.probe
    path = cfg.file or c.base_model.probe_path
    if not path:
        raise UserError("probe.enabled is true but probe.file is empty and the base model ships no probe set")
    return probe_set(path, c.tasks, cfg.problems_per_type)


def evaluate(c: Components, students: Sequence[Member], step: int, *, include_base: bool) -> list[dict[str, Any]]:
    """The probe records of a run's students' current versions (and the base first, with ``include_base``)."""
    cfg = c.recipe.probe
    targets = [ProbeTarget(m.id, c.adapter_ref(m), m.version_name, m.role) for m in students]
    if include_base:
        targets.insert(0, ProbeTarget("base", None, "base", "base"))
    sampling = SamplingParams(n=cfg.samples, temperature=cfg.temperature, seed=0) if cfg.samples else None
    return probe_records(step, c.engine, c.tasks, run_probe_set(c), targets, cfg.max_tokens, sampling)
