"""A third-party plugin in 30 lines: a CSV sink for step metrics and an observer hook."""

import csv
from pathlib import Path

from pydantic import Field

from populora_core.api import Params, hookimpl


class CsvSinkParams(Params):
    filename: str = Field("metrics.csv", min_length=1)
    keys: list[str] = Field(default_factory=lambda: ["step", "solve_rate", "validity"])


class CsvSink:
    def __init__(self, params, *, run_dir):
        self.path = Path(run_dir) / params.filename
        self.keys = params.keys
        self.path.write_text(",".join(self.keys) + "\n")

    def emit(self, record):
        if record.get("event") == "step":
            with open(self.path, "a", newline="") as fh:
                csv.writer(fh).writerow([record.get(k) for k in self.keys])

    def close(self):
        pass


@hookimpl
def register_sinks(register):
    register("example_csv", CsvSink, params=CsvSinkParams)


@hookimpl
def on_run_end(run, status):
    (Path(run.run_dir) / "example_sink_status.txt").write_text(status)
