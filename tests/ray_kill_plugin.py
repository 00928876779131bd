"""Test plugin: SIGKILL one Ray worker of the run right before step ``POPULORA_TEST_KILL_STEP`` trains.

Loaded with ``populora --plugin tests/ray_kill_plugin.py``; the worker dies the way a crashed or OOM-killed
process does, in the middle of a step (generated and rewarded, not yet trained).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from populora_core import hookimpl


@hookimpl
def after_rewards(run, step, rollouts):
    if str(step) == os.environ.get("POPULORA_TEST_KILL_STEP"):
        workers = json.loads((Path(run.run_dir) / "ray_workers.json").read_text())
        os.kill(workers[-1]["pid"], signal.SIGKILL)
