"""Weights & Biases metric sink: every numeric field of every step record, probe accuracies, the recipe as config.

wandb is imported when a recipe names the sink, never when the plugin loads. ``WANDB_MODE=offline`` (or
``mode: offline``) writes the run under ``wandb/`` without a network; ``wandb sync`` uploads it later.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from populora_core.api import Params, hookimpl
from populora_core.api.components import MetricSink

RUN_ID_FILE = "wandb_run_id"


class WandbParams(Params):
    """Where the run goes in W&B; unset fields are wandb's own defaults (WANDB_* variables, login)."""

    project: str = Field("populora", min_length=1, description="W&B project")
    entity: str | None = Field(None, description="W&B team or user (default: the logged-in user's)")
    name: str | None = Field(None, description="W&B run name (default: the run directory's name)")
    group: str | None = Field(None, description="group runs, e.g. the seeds of one study arm")
    tags: list[str] = Field(default_factory=list)
    mode: Literal["online", "offline", "disabled"] | None = Field(
        None, description="default: WANDB_MODE, else online when logged in"
    )
    dir: str | None = Field(None, description="where wandb/ is written (default: WANDB_DIR, else the run directory)")


class WandbSink(MetricSink):
    """One W&B run per PopuLoRA run; a resumed run continues the same W&B run (its id is kept in the run dir)."""

    def __init__(self, params: WandbParams, *, run_dir: str | Path, resume_step: int = 0) -> None:
        import wandb

        run_dir = Path(run_dir)
        id_file = run_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else None  # None: wandb makes one
        recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text())
        mode = params.mode or os.environ.get("WANDB_MODE", "online")
        resume: dict[str, Any] = {"resume": "allow"} if run_id else {}
        if run_id and resume_step and mode == "online":
            # the steps after the checkpoint are logged again: rewind the W&B run's history to the checkpoint
            # (offline runs cannot rewind: `wandb sync` keeps the first copy of those steps)
            resume = {"resume_from": f"{run_id}?_step={resume_step + 1}"}
        self.run = wandb.init(
            project=params.project,
            entity=params.entity,
            name=params.name or run_dir.resolve().name,
            group=params.group,
            tags=params.tags or None,
            mode=params.mode,
            dir=params.dir or (None if os.environ.get("WANDB_DIR") else str(run_dir)),
            id=None if "resume_from" in resume else run_id,
            config=recipe,
            **resume,
        )
        id_file.write_text(self.run.id + "\n")

    def emit(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        if not isinstance(step, int):
            return
        if record.get("event") == "step":
            data = {k: v for k, v in record.items() if k != "step" and _is_number(v)}
        elif record.get("event") == "probe" and _is_number(record.get("accuracy")):
            data = {f"probe/{record['member']}/{record['task_type']}": record["accuracy"]}
        else:
            return
        self.run.log(data, step=step)

    def close(self) -> None:
        self.run.finish()


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@hookimpl
def register_sinks(register):
    register("wandb", WandbSink, params=WandbParams)
