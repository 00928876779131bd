"""TensorBoard metric sink: every numeric field of every step record becomes a scalar.

The smallest useful plugin: one params model, one factory, one hookimpl.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from populora_core.api import Params, hookimpl
from populora_core.api.components import MetricSink


class TensorBoardParams(Params):
    """Where event files go, relative to the run directory."""

    subdir: str = Field("tensorboard", min_length=1)
    flush_secs: int = Field(10, ge=1)


class TensorBoardSink(MetricSink):
    def __init__(self, params: TensorBoardParams, *, run_dir: str | Path, resume_step: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # a resumed run logs the steps after its checkpoint again: TensorBoard drops the earlier copies
        purge = resume_step + 1 if resume_step else None
        self.writer = SummaryWriter(str(Path(run_dir) / params.subdir), flush_secs=params.flush_secs, purge_step=purge)

    def emit(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        if record.get("event") != "step" or step is None:
            return
        for key, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                self.writer.add_scalar(key, value, global_step=step)

    def close(self) -> None:
        self.writer.close()


@hookimpl
def register_sinks(register):
    register("tensorboard", TensorBoardSink, params=TensorBoardParams)
