"""Helpers for tests that run ``populora``: the real console script in a subprocess, or what its commands call in
this process (a test that checks output or results, not the process)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
POPULORA = shutil.which("populora", path=str(Path(sys.executable).parent)) or "populora"
#: the test stack (``--plugin tests/fake_stack.py``) and its 2-teacher 2-student recipe
FAKE_STACK = REPO / "tests" / "fake_stack.py"
FAKE_RECIPE = REPO / "tests" / "recipes" / "fake_2t2s.yaml"
#: shorter generations than nano's recipes (160 and 96 tokens) for tests that compare runs or check when things
#: happen, not what the model writes: the same path, sooner
SHORT_GENERATIONS = ("rollout.propose_max_tokens=64", "rollout.solve_max_tokens=48")


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        [POPULORA, *args], capture_output=True, text=True, env=full_env, cwd=cwd or REPO, timeout=timeout
    )


def invoke_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``populora ARGS`` in this process (click's runner, from ``cwd``, the repository by default), for a command
    whose output or results, not its process, a test checks: a run, an export, a ``--dry-run`` or ``plan`` imports
    torch, transformers and PEFT, ~5 s in a fresh process and nothing more here. Returns what :func:`run_cli`
    returns; an exception the command did not turn into an exit code is raised (a subprocess would print its
    traceback and exit 1). ``env`` is set for the command's duration. ``--plugin`` files go into a process-wide
    plugin manager of their own, forgotten after the command, so no later test sees their components."""
    from click.testing import CliRunner

    from populora_core.cli.commands import cli
    from populora_core.cli.group import plugin_options_first, split_plugin_options
    from populora_core.plugin.manager import reset_manager

    argv = plugin_options_first(list(args))
    plugin_files = split_plugin_options(argv)[0]
    if plugin_files:
        reset_manager()
    try:
        with contextlib.chdir(cwd or REPO), warnings_as_the_console_script():
            result = CliRunner().invoke(
                cli, argv, prog_name="populora", env={"HF_HUB_OFFLINE": "1", **(env or {})}, catch_exceptions=False
            )
    finally:
        if plugin_files:
            reset_manager()
    return subprocess.CompletedProcess(["populora", *argv], result.exit_code, result.stdout, result.stderr)


@contextlib.contextmanager
def warnings_as_the_console_script() -> Iterator[None]:
    """Python warnings as ``populora`` shows them: on stderr (click's runner's, while it runs), once per place, as
    ``warning_line`` writes them, with a fresh interpreter's filters. In pytest they would go to its recorder,
    filtered by pytest's settings, and a place that warned in an earlier test would stay silent."""
    from populora_core.cli.group import warning_line

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        sys.stderr.write(warning_line(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        warnings.resetwarnings()
        for ignored in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", ignored)
        warnings.showwarning = show
        yield


def fake_stack_manager(*plugins: object) -> Any:
    """The installed plugins, tests/fake_stack.py and ``plugins`` (each added under its own name): what
    ``populora --plugin tests/fake_stack.py`` loads, with a test's hook implementations beside it."""
    from populora_core.plugin.manager import PluginManager

    pm = PluginManager()
    pm.load_entry_points()
    pm.load_file(str(FAKE_STACK))
    for i, plugin in enumerate(plugins):
        assert pm.add_plugin(plugin, f"test-plugin-{i}")
    return pm


def run_in_process(pm: Any, run_dir: Path, overrides: list[str] | None = None, recipe: Path = FAKE_RECIPE) -> Any:
    """``populora run RECIPE OVERRIDES --run-dir RUN_DIR`` in this process (load_recipe, start_run, execute: what the
    command calls), with ``pm``'s plugins; the run's RunDir. The fake stack's model is ``$POPULORA_TEST_MODEL``."""
    from populora_core.recipe.validate import load_recipe
    from populora_core.run.loop import execute, start_run
    from populora_core.run.run_dir import RunDir

    loaded, resolved = load_recipe(recipe, overrides or [], pm.registry)
    directory = RunDir(run_dir)
    execute(start_run(loaded, resolved, directory, pm))
    return directory


def adapter_hashes(run_dir: Path) -> dict[str, str]:
    """Adapter version -> sha256 of its weights: two runs that computed the same agree on every one."""
    return {
        p.name: hashlib.sha256((p / "adapter_model.safetensors").read_bytes()).hexdigest()
        for p in sorted((run_dir / "adapters").iterdir())
    }


def run_recipe(recipe: str | Path, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """``populora run RECIPE OVERRIDES`` into ``run_dir`` as end-to-end tests run it: one thread, no progress bar."""
    return run_cli(
        "run",
        str(recipe),
        *overrides,
        "--run-dir",
        str(run_dir),
        "--no-progress",
        env={"OMP_NUM_THREADS": "1"},
        timeout=900,
    )


def pip_install_target(package_dir: Path, target: Path, timeout: float | None = None) -> None:
    """Install a plugin package into ``target`` (put on PYTHONPATH): a real entry point, no venv pollution."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(package_dir),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def install_a_copy(package_dir: Path, root: Path) -> Path:
    """pip-install a copy of a plugin package into ``root/site``: the folder to put on PYTHONPATH, with the package's
    real entry points, no venv change and nothing to uninstall. pip builds in the copy, so the source tree gets no
    ``build/`` or ``*.egg-info`` (a ``build/`` copy of an example's modules would be one more file the rule tests
    collect); several packages installed with one ``root`` share its site."""
    src = root / "src" / package_dir.name
    shutil.copytree(package_dir, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip_install_target(src, root / "site", timeout=300)
    return root / "site"


PAUSE_PLUGIN = str(Path(__file__).resolve().parent / "pause_plugin.py")


def kill_inside_step(
    args: list[str], env: dict[str, str], step: int, marker: Path, timeout: float = 600, sig: int = signal.SIGKILL
) -> tuple[int, str]:
    """Run ``populora --plugin pause_plugin.py ARGS`` and send ``sig`` inside ``step``, after its matchmaking;
    (exit code, stderr)."""
    pause = {**env, "POPULORA_TEST_PAUSE_STEP": str(step), "POPULORA_TEST_PAUSE_MARKER": str(marker)}
    proc = subprocess.Popen(
        [POPULORA, "--plugin", PAUSE_PLUGIN, *args],
        env=pause,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as at a terminal: a test runner started in the background (``cmd &``) ignores SIGINT, and an
        # ignored signal stays ignored across exec, so the run would never see it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + timeout
    while time.time() < deadline and not marker.exists() and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(sig)
    _, stderr = proc.communicate()
    reached = marker.read_text() if marker.exists() else None
    assert reached == str(step), f"the run never reached the pause point (marker {reached!r}); stderr:\n{stderr}"
    return proc.returncode, stderr


def as_if_killed_after(run_dir: Path | str, step: int) -> None:
    """Leave a finished run as a kill inside step ``step + 1`` leaves it: checkpoints up to ``step``, LATEST naming
    it. The newer checkpoints its longer life wrote are removed: a resume rightly goes on from the newest intact one."""
    checkpoints = Path(run_dir) / "checkpoints"
    for path in checkpoints.iterdir():
        if path.name.isdigit() and int(path.name) > step:
            shutil.rmtree(path)
    (checkpoints / "LATEST").write_text(f"{step:08d}\n")
