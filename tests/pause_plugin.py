"""Test plugin: pauses a run inside a chosen step so a test can SIGKILL it at a known point.

``POPULORA_TEST_PAUSE_STEP=N`` and ``POPULORA_TEST_PAUSE_MARKER=path``: after matchmaking of step N the
run writes the marker file and sleeps (``POPULORA_TEST_PAUSE_S`` seconds, default 120), so the kill lands mid-step
(after the step began, before its rollouts, updates and checkpoint). The pause changes no state, so a run with and
without it is the same.
"""

import os
import time
from pathlib import Path

from populora_core import hookimpl


@hookimpl
def after_matchmaking(run, step, matches):
    if str(step) == os.environ.get("POPULORA_TEST_PAUSE_STEP"):
        # written whole, then renamed: a test that sees the marker never reads it half-written (nor kills
        # the run between its creation and its write)
        marker = Path(os.environ["POPULORA_TEST_PAUSE_MARKER"])
        partial = marker.with_name(marker.name + ".partial")
        partial.write_text(str(step))
        os.replace(partial, marker)
        time.sleep(float(os.environ.get("POPULORA_TEST_PAUSE_S", "120")))
