"""A stop on a signal that keeps the last step: SIGTERM (Slurm's time limit and preemption, Kubernetes, spot
instances) and SIGUSR1 (Slurm's ``--signal``) end a run with a checkpoint of its newest complete step.

A step is abortable until it trains: nothing it did before changes what a checkpoint records, because the run took a
:func:`.state.snapshot` of the complete step before it began. A signal there ends the step at once (or, when the
recipe's ``checkpoint.stop_grace_s`` leaves time for the rest of the step by the last step's duration, lets it finish,
with a timer that ends it when the grace runs out first). Once a step trains it changes the trainer's state, so it
finishes and is checkpointed. A second signal exits at once: the checkpoints on disk are atomic, so the run resumes
from the newest intact one.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_CODE = 143  # 128 + SIGTERM: what a job killed by SIGTERM exits with, so schedulers read it as such


class StopRequested(BaseException):  # like KeyboardInterrupt: not an error
    """A stop signal ended the run; :func:`.loop.execute` fills in what it kept before it re-raises."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.in_step: int | None = None  # the step in progress when the run stopped (None: between steps)
        self.finished_step = False  # the step in progress was let finish within the grace period
        self.checkpoint_step: int | None = None  # the step the newest checkpoint holds (None: no step completed)


class Stoppable(Protocol):
    abortable: bool

    def step_time_left(self) -> float | None: ...


class StopSignals:
    """SIGTERM and SIGUSR1 handlers while a run's steps run (installed only in the main thread, where Python delivers
    signals; a run driven from another thread keeps the process's handlers)."""

    def __init__(self, run: Stoppable, grace_s: float, note: Callable[[str], None]) -> None:
        self.run, self.grace_s, self.note = run, grace_s, note
        self.requested: str | None = None
        self.finishing = False  # the step in progress finishes within the grace period
        self._previous: dict[int, Any] = {}
        self._timer: tuple[float, tuple[float, float]] | None = None  # when armed, the alarm it replaced

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        rearm = None
        if self._timer is not None:  # the grace's timer: the process's own alarm (if any) is put back
            signal.setitimer(signal.ITIMER_REAL, 0)
            armed_at, (delay, interval) = self._timer
            self._timer = None
            if delay:
                rearm = (max(1e-3, delay - (time.monotonic() - armed_at)), interval)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if rearm is not None:
            signal.setitimer(signal.ITIMER_REAL, *rearm)

    def check(self) -> None:
        """Between steps: a stop requested while the last step trained or checkpointed ends the run here."""
        if self.requested is not None:
            raise StopRequested(self.requested)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:  # the scheduler's second word (or a user's): no more waiting
            self.note(f"second stop signal ({name}): exiting at once; the newest intact checkpoint is kept")
            sys.stderr.flush()
            os._exit(EXIT_CODE)
        self.requested = name
        if not self.run.abortable:  # it trains or writes its checkpoint: it finishes, then the run stops
            return
        left = self.run.step_time_left()
        if self.grace_s > 0 and left is not None and left <= self.grace_s:
            self.finishing = True
            # the estimate is the last step's: a timer makes the grace a hard bound (SIGALRM only from now on, so
            # a process's own alarm, pytest-timeout's say, is disturbed only by a stop)
            self._previous.setdefault(signal.SIGALRM, signal.signal(signal.SIGALRM, self._on_alarm))
            self._timer = (time.monotonic(), signal.setitimer(signal.ITIMER_REAL, self.grace_s))
            self.note(
                f"{name}: finishing the step in progress (about {left:.0f} s left, checkpoint.stop_grace_s "
                f"{self.grace_s:g}), then a checkpoint and a stop"
            )
            return
        raise StopRequested(name)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        """The grace period ran out: a step that has not begun to train is ended; one that trains finishes."""
        if self.requested is not None and self.run.abortable:
            self.finishing = False
            raise StopRequested(self.requested)
