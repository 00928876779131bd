"""A stop on SIGTERM or SIGUSR1 keeps the newest complete step: a checkpoint of it, the stop and the resume command in
run.log and on the terminal, exit 143; the resumed run ends with the adapters of an uninterrupted one. A second
signal exits at once and the run still resumes from its newest intact checkpoint.

The fake stack's tests are quick; the nano test signals a real run (sandbox, AZR tasks, hf engine, trr++)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from populora_core.run.run_dir import RunDir
from tests.cli_helpers import (
    PAUSE_PLUGIN,
    POPULORA,
    REPO,
    SHORT_GENERATIONS,
    fake_stack_manager,
    kill_inside_step,
    run_cli,
    run_in_process,
)

TESTS = Path(__file__).resolve().parents[1]
FAKE = str(TESTS / "fake_stack.py")
FAKE_RECIPE = str(TESTS / "recipes" / "fake_2t2s.yaml")


@pytest.fixture()
def env(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("POPULORA_TEST_MODEL", str(tiny_model_dir))  # the in-process reference runs' model
    return {**os.environ, "HF_HUB_OFFLINE": "1", "POPULORA_TEST_MODEL": str(tiny_model_dir)}


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


def _same_run(run_dir: Path, reference: Path) -> None:
    """The same adapters (every version, bit for bit), members, lineage and problems as the uninterrupted run."""
    names = sorted(p.name for p in (reference / "adapters").iterdir())
    assert sorted(p.name for p in (run_dir / "adapters").iterdir()) == names
    for name in names:
        a, b = _tensors(reference / "adapters" / name), _tensors(run_dir / "adapters" / name)
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a), f"{name} differs after the stop"
    for log in ("lineage.jsonl", "tasks/problems.jsonl"):
        assert (run_dir / log).read_text() == (reference / log).read_text(), log
    assert json.loads((run_dir / "members.json").read_text()) == json.loads((reference / "members.json").read_text())


def _latest(run_dir: Path) -> str:
    return (run_dir / "checkpoints" / "LATEST").read_text().strip()


def _fake_args(run_dir: Path, *overrides: str) -> list[str]:
    return ["--plugin", FAKE, "run", FAKE_RECIPE, *overrides, "--run-dir", str(run_dir), "--no-progress"]


def _reference(env: dict[str, str], run_dir: Path, *overrides: str) -> Path:
    """The uninterrupted run of the fake recipe with ``overrides``, run in this process (start_run and execute, what
    `populora run` calls): the stopped runs are the CLI's, in processes of their own, so each comparison also says
    that the CLI's run computes what the core's does."""
    assert os.environ["POPULORA_TEST_MODEL"] == env["POPULORA_TEST_MODEL"]
    run_in_process(fake_stack_manager(), run_dir, list(overrides))
    return run_dir


def test_sigusr1_mid_step_checkpoints_the_step_before_and_resumes_to_the_uninterrupted_run(env, tmp_path):
    overrides = ("checkpoint.every=10",)  # no checkpoint before the stop but the one it writes
    reference = _reference(env, tmp_path / "reference", *overrides)
    run_dir = tmp_path / "stopped"
    code, stderr = kill_inside_step(_fake_args(run_dir, *overrides), env, 3, tmp_path / "paused", sig=signal.SIGUSR1)
    assert code == 143, stderr
    assert "Traceback" not in stderr
    said = "stopped by SIGUSR1 in step 3 (before it trained; that step is redone): checkpoint of step 2 kept; "
    said += f"`populora resume {run_dir}` continues from it"
    assert said in stderr
    assert said in (run_dir / "run.log").read_text()
    assert _latest(run_dir) == "00000002"
    assert RunDir(run_dir).running_pid() is None  # released: its lock went with it
    resumed = run_cli("resume", str(run_dir), "--no-progress", "--plugin", FAKE, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr and "at step 2" in resumed.stderr
    _same_run(run_dir, reference)


def test_a_step_that_fits_the_grace_period_finishes_and_is_kept(env, tmp_path):
    overrides = ("checkpoint.every=10", "checkpoint.stop_grace_s=60")
    reference = _reference(env, tmp_path / "reference", *overrides)
    run_dir = tmp_path / "stopped"
    quick = {**env, "POPULORA_TEST_PAUSE_S": "2"}
    code, stderr = kill_inside_step(_fake_args(run_dir, *overrides), quick, 3, tmp_path / "paused", sig=signal.SIGTERM)
    assert code == 143, stderr
    assert "SIGTERM: finishing the step in progress" in stderr
    finished = "stopped by SIGTERM after finishing the step in progress (checkpoint.stop_grace_s): checkpoint of step 3"
    assert finished in stderr
    assert _latest(run_dir) == "00000003"
    resumed = run_cli("resume", str(run_dir), "--no-progress", "--plugin", FAKE, env=env)
    assert resumed.returncode == 0, resumed.stderr
    _same_run(run_dir, reference)


def test_a_step_that_outlasts_the_grace_period_is_ended_when_it_runs_out(env, tmp_path):
    run_dir = tmp_path / "stopped"
    began = time.monotonic()
    code, stderr = kill_inside_step(
        _fake_args(run_dir, "checkpoint.every=10", "checkpoint.stop_grace_s=1"),
        env,
        3,
        tmp_path / "paused",
        sig=signal.SIGTERM,
    )
    assert code == 143 and time.monotonic() - began < 100, stderr  # the pause is 120 s: the grace ended it
    assert "finishing the step in progress" in stderr and "stopped by SIGTERM in step 3" in stderr
    assert _latest(run_dir) == "00000002"


def test_a_stop_before_any_step_completed_keeps_nothing_and_says_resume_starts_over(env, tmp_path):
    run_dir = tmp_path / "stopped"
    code, stderr = kill_inside_step(_fake_args(run_dir), env, 1, tmp_path / "paused", sig=signal.SIGTERM)
    assert code == 143, stderr
    assert "before any step completed: nothing to keep" in stderr and "starts the run over" in stderr
    assert not (run_dir / "checkpoints" / "LATEST").exists()


def test_a_second_sigterm_exits_at_once_and_the_run_resumes_from_the_newest_intact_checkpoint(env, tmp_path):
    """The stop's checkpoint of step 3 is being written (the fake trainer pauses inside it) when the second SIGTERM
    comes: the run exits at once, 143, and resumes from step 2's checkpoint to the uninterrupted run."""
    marker = tmp_path / "saving"
    overrides = ("checkpoint.every=2", "trainer.params.save_pause_step=3", f"trainer.params.save_pause_marker={marker}")
    reference = _reference(env, tmp_path / "reference", *overrides)
    run_dir = tmp_path / "stopped"
    paused = tmp_path / "paused"
    proc = subprocess.Popen(
        [POPULORA, "--plugin", PAUSE_PLUGIN, *_fake_args(run_dir, *overrides)],
        env={**env, "POPULORA_TEST_PAUSE_STEP": "4", "POPULORA_TEST_PAUSE_MARKER": str(paused)},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        for wait_for in (paused, marker):
            while not wait_for.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert wait_for.exists(), proc.stderr.read() if proc.poll() is not None else f"no {wait_for.name}"
            if wait_for is paused:
                proc.send_signal(signal.SIGTERM)
        second = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143 and time.monotonic() - second < 30, stderr
    assert "second stop signal (SIGTERM): exiting at once" in stderr
    assert "second stop signal (SIGTERM)" in (run_dir / "run.log").read_text()
    assert _latest(run_dir) == "00000002"  # the interrupted write of step 3's is not a checkpoint
    resumed = run_cli("resume", str(run_dir), "--no-progress", "--plugin", FAKE, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "at step 2" in resumed.stderr
    _same_run(run_dir, reference)


def test_a_run_leaves_the_process_signal_handlers_and_alarm_as_it_found_them(tiny_model_dir, tmp_path, monkeypatch):
    """The stop's handlers are the run's only while it runs: a caller's SIGTERM handler and its alarm (pytest-timeout's,
    here) are there after it as before."""
    monkeypatch.setenv("POPULORA_TEST_MODEL", str(tiny_model_dir))
    pm = fake_stack_manager()
    mine = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGALRM)}
    handlers = {sig: signal.getsignal(sig) for sig in mine}
    before = signal.setitimer(signal.ITIMER_REAL, 600)
    try:
        run_in_process(pm, tmp_path / "run", ["steps=2"])
        assert {sig: signal.getsignal(sig) for sig in mine} == handlers
        assert 500 < signal.getitimer(signal.ITIMER_REAL)[0] <= 600
    finally:
        signal.setitimer(signal.ITIMER_REAL, *before)
        for sig, handler in mine.items():
            signal.signal(sig, handler)


NANO = ("steps=3", "checkpoint.every=10", "probe.enabled=false", "rollout.proposals_per_teacher=2")
NANO += ("rollout.solver_samples=2", "evolution.every=2", "evolution.ready_after=0")
NANO += SHORT_GENERATIONS


@pytest.mark.slow
def test_sigterm_in_the_middle_of_a_real_nano_step_resumes_to_the_same_final_adapters(tmp_path):
    """nano, 3 steps, a child at step 2, no checkpoint due before the end: SIGTERM inside step 3 keeps step 2."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def args(run_dir: Path) -> list[str]:
        return ["run", str(REPO / "recipes" / "nano.yaml"), *NANO, "--run-dir", str(run_dir), "--no-progress"]

    reference = tmp_path / "reference"
    done = subprocess.run([POPULORA, *args(reference)], env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert any(json.loads(x)["event"] == "evolution" for x in (reference / "events.jsonl").read_text().splitlines())
    run_dir = tmp_path / "stopped"
    code, stderr = kill_inside_step(args(run_dir), env, 3, tmp_path / "paused", sig=signal.SIGTERM)
    assert code == 143, stderr[-3000:]
    assert f"checkpoint of step 2 kept; `populora resume {run_dir}` continues from it" in stderr
    assert "stopped by SIGTERM in step 3" in (run_dir / "run.log").read_text()
    assert _latest(run_dir) == "00000002"
    resumed = subprocess.run(
        [POPULORA, "resume", str(run_dir), "--no-progress"], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _same_run(run_dir, reference)
