"""Shared pieces of the AZR task tests: the executor they run against, and task builders.

The tests run against the registered ``sandbox`` executor. Only where that plugin is missing do they
fall back to :class:`SubprocessTestExecutor`, a plain one-interpreter-per-job runner that lives here in
tests/ (it isolates nothing and is never used by the plugin). ``POPULORA_AZR_TEST_EXECUTOR=subprocess``
forces the fallback.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from populora_core.api.components import ExecJob, ExecResult, Executor

_RUNNER = r"""
import json, sys
job = json.loads(sys.stdin.read())
ns = {"__name__": "__main__"}
try:
    exec(compile(job["code"], "<program>", "exec"), ns)
    value = repr(eval(job["expr"], ns)) if job["expr"] is not None else None
    out = {"status": "ok", "value": value}
except BaseException as exc:
    out = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
sys.__stdout__.write("\n@@RESULT@@" + json.dumps(out))
"""


class SubprocessTestExecutor(Executor):
    """Test-only fallback: one fresh ``python -I`` per job, ``PYTHONHASHSEED`` from ``hash_variant``."""

    def __init__(self, timeout_s: float = 10.0, workers: int = 2, max_output: int = 1 << 20) -> None:
        self.timeout_s = timeout_s
        self.workers = workers
        self.max_output = max_output

    def _one(self, job: ExecJob) -> ExecResult:
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": str(1000 + job.hash_variant)}
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-c", _RUNNER],
                env=env,
                capture_output=True,
                text=True,
                input=json.dumps({"code": job.code, "expr": job.expr}),
                timeout=job.timeout_s or self.timeout_s,
            )
        except subprocess.TimeoutExpired:
            return ExecResult(status="timeout")
        head, sep, tail = proc.stdout.rpartition("\n@@RESULT@@")
        if not sep:
            return ExecResult(status="killed", error=proc.stderr[-500:])
        res = json.loads(tail)
        if res["status"] == "ok" and res["value"] is not None and len(res["value"]) > self.max_output:
            return ExecResult(status="output_too_large")
        return ExecResult(status=res["status"], value=res.get("value"), error=res.get("error"), stdout=head)

    def run_batch(self, jobs: Sequence[ExecJob]) -> list[ExecResult]:
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(self._one, jobs))

    def close(self) -> None:
        pass


_EXECUTOR = None


def shared_executor():
    """One executor per test session (closed at exit), shared by every AZR test module."""
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = make_test_executor()
        atexit.register(_EXECUTOR.close)
    return _EXECUTOR


def make_test_executor():
    """The registered sandbox executor if installed (short timeout for tests), else the fallback."""
    if os.environ.get("POPULORA_AZR_TEST_EXECUTOR") != "subprocess":
        from populora_core.api.errors import UserError
        from populora_core.plugin.manager import get_manager

        try:
            comp = get_manager().registry.get("executor", "sandbox")
        except UserError:
            comp = None
        if comp is not None:
            return comp.build({"timeout_s": 5.0})
    return SubprocessTestExecutor(timeout_s=5.0)


def build_task(name: str, executor, rng=0, tasks=None, **params):
    """A task through the registry, exactly as a recipe builds it (``tasks``: the run's tasks by name)."""
    from populora_core import get_registry

    return get_registry().get("task", name).build(params, executor=executor, rng=rng, tasks=tasks)


def build_tasks(names, executor, rng=0, **params) -> dict:
    """Tasks meant to work together, as a run builds them: one mapping, filled in order, given to each."""
    tasks: dict = {}
    for name in names:
        tasks[name] = build_task(name, executor, rng, tasks=tasks, **params)
    return tasks


def seeds_dir():
    """$POPULORA_AZR_SEEDS, else shared/ beside the checkout (as CI lays it), else /work/shared."""
    from pathlib import Path

    if "POPULORA_AZR_SEEDS" in os.environ:
        return Path(os.environ["POPULORA_AZR_SEEDS"])
    beside = Path(__file__).resolve().parents[2] / "shared" / "data" / "azr_seeds"
    return beside if beside.is_dir() else Path("/work/shared/data/azr_seeds")


def load_seeds(filename: str) -> list[dict]:
    """Rows of one AZR seed file, or skip the test when the data is absent."""
    import pytest

    path = seeds_dir() / filename
    if not path.is_file():
        pytest.skip(f"AZR seed data not found at {path}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
