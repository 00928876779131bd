"""The public entry for scripts (benchmarks, experiments, notebooks) that drive runs without the ``populora`` command:
read a recipe, start a run, step it or execute it, read its events, call one phase outside the loop, plan a recipe,
diagnose the machine. A script imports this module, ``populora_core.api`` and ``populora_core.services``; the
modules these wrap (``run.loop``, ``recipe.validate``, ``run.phases``, ...) stay private and may change in any
release (``tests/core/test_import_rules.py`` holds ``benchmarks/`` to it). A plugin never drives a run: it imports
``PUBLIC_MODULES`` only.

Each function is the core's own, with the process's plugin manager passed for the caller::

    from populora_core.cli import driver

    recipe, resolved = driver.load_recipe("recipes/nano.yaml", ["steps=2"])
    run = driver.start_run(recipe, resolved, "/tmp/runs/nano")
    driver.execute(run)  # or run.run_step() per step, then run.close()
    steps = [e for e in driver.events("/tmp/runs/nano") if e["event"] == "step"]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..api.memory import Arch
from ..api.schema import Recipe
from ..plugin.manager import get_manager
from ..recipe import validate
from ..run import loop, plan
from ..run.loop import Run, execute
from ..run.metrics import MODEL_PHASES
from ..run.phases import solve, train
from ..run.probe import run_probe_set
from ..run.run_dir import RunDir
from .doctor import diagnose, nvidia_smi

__all__ = [
    "MODEL_PHASES",
    "Run",
    "diagnose",
    "events",
    "execute",
    "load_recipe",
    "nvidia_smi",
    "plan_recipe",
    "run_probe_set",
    "solve",
    "start_run",
    "train",
]


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> tuple[Recipe, dict[str, Any]]:
    """A recipe file read, overridden (``key.sub=value``) and validated against every installed plugin: the typed
    recipe and the resolved dict :func:`start_run` writes to the run directory."""
    return validate.load_recipe(path, overrides, get_manager().registry)


def start_run(recipe: Recipe, resolved: dict[str, Any], run_dir: str | Path) -> Run:
    """A new run in ``run_dir`` (created and locked; it must not hold one), initialised as ``populora run`` starts
    one: step it with ``run.run_step()`` and ``run.close()`` it, or hand it to :func:`execute`, which closes it."""
    return loop.start_run(recipe, resolved, RunDir(Path(run_dir)), get_manager())


def events(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every record of a run's ``events.jsonl`` (``{"event": "step", ...}`` per step, probes, evolution), in order."""
    return RunDir(Path(run_dir)).read_log("events.jsonl")


def plan_recipe(recipe: Recipe, arch: Arch, *, gpu_bytes: int) -> dict[str, Any]:
    """``populora plan``'s plan of a recipe on one GPU of ``gpu_bytes``: rows, both phases' peaks (``peak_gib``,
    ``training_gib``, ``trainer_side_bytes``), verdict and suggestions."""
    return plan.plan_recipe(recipe, arch, gpu_bytes=gpu_bytes, registry=get_manager().registry)
