"""A seed's run is the same on every x86 CPU: the nano recipes' ``runtime: {cpu_isa: avx2}``.

The recipe section makes torch, MKL and oneDNN take their AVX2 code paths (``populora_core/services/runtime.py``), so
an AVX-512 box computes what an AVX2 box does. The pinned test runs the quickstart recipe for two steps (seed
0, one thread, no probe) and compares the sha256 of every adapter version with values committed here: any
x86 machine with AVX2 that runs the suite checks that it reproduces them.

The values change with any change to what a step computes (the loop, prompts, sampling, the trainer). Re-pin
them after such a change, on any x86 machine, with::

    OMP_NUM_THREADS=1 .venv/bin/python -m tests.core.test_cross_cpu   # prints PINNED_ADAPTERS to paste below
"""

from __future__ import annotations

import ast
import os
import platform
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import yaml

from populora_core import RecipeError
from populora_core.recipe.validate import load_recipe
from populora_core.services.runtime import CPU_ISA_ENV, apply_cpu_isa, apply_threads
from tests.cli_helpers import REPO, adapter_hashes, run_cli

#: the pinned run: recipes/nano.yaml (runtime.cpu_isa: avx2) with these overrides, one torch thread
RECIPE = REPO / "recipes" / "nano.yaml"
OVERRIDES = ("seed=0", "steps=2", "probe.enabled=false")
#: adapter version -> sha256 of its adapter_model.safetensors, from `python -m tests.core.test_cross_cpu`
PINNED_ADAPTERS: dict[str, str] = {
    "s0@v0": "c76809e946a6c4a37bd8179a0311da07eb9c7227951f431bcafb325328515869",
    "s0@v1": "a682c40e5119f0ec876349ea53fc50d435c5803d7d271b984f88f2b44a96d39d",
    "s0@v2": "91c43a60b7e9c175b61ab8585772f1d140c93d39d46c5d46c45837d58b7031f9",
    "s1@v0": "0ec30f8530b7d069b8bb063d3b428eb2f28aa1de118f284d21e4046e084fbb7c",
    "s1@v1": "3f69fba5cf1161516f237181969d2d28efaa73e5e06722415944775c799ac689",
    "s1@v2": "e3526696a68cad9f5bc20330fc7c9264155e0b11bfa9caf8b9cae26dd5e0ae94",
    "t0@v0": "6ea11643200bda6a2a091dae098025813a7fb1a1b429d1eea131dc3a15cd65c4",
    "t0@v1": "7277d71af35b896e786aab47cc109fc4c270cb1c92a51da25d38244e1216c95b",
    "t0@v2": "860371ada675b17c974dd73b4b15b9e2c1b7fa4c3a2b3bff8d91ffd15d3522ee",
    "t1@v0": "51dc1c3fef44bd264646ecdc793de6d716d5a28e44e5733b67bd54b7256c4c78",
    "t1@v1": "4388a273b167d22525eb2947e490600f91d146de503a7995250f1a952e1e7e10",
    "t1@v2": "7e876d6e075c81a8077a747e879ceb021e7bf6681fc504d49e26f8e93bfd0a1b",
}
CPU_VARS = sorted(CPU_ISA_ENV["avx2"])


def _intel_x86_with_avx2() -> bool:
    """Where the pin is known to hold: Intel x86 with AVX2 (pinned on an AVX-512 Xeon, family 6 model 167; the
    project's CI reproduced it). On an AMD EPYC (family 26 model 2, AVX-512) the same settings give other adapters
    from step 1, and MKL_CBWR=AVX2,STRICT or MKL_ENABLE_INSTRUCTIONS=AVX2 change nothing there (MKL_CBWR=COMPATIBLE
    changes them, to values no Intel box has checked yet)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "GenuineIntel" in cpuinfo and " avx2" in cpuinfo and " fma" in cpuinfo


def pinned_run(run_dir: Path) -> dict[str, str]:
    """``populora run`` of the pinned recipe in a subprocess (torch not yet loaded there); the adapters' hashes."""
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    result = run_cli("run", str(RECIPE), *OVERRIDES, "--run-dir", str(run_dir), "--no-progress", env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return adapter_hashes(run_dir)


@pytest.mark.slow
@pytest.mark.skipif(not _intel_x86_with_avx2(), reason="the pinned values are those of Intel's AVX2 code paths")
def test_cross_cpu_seed_reproduces_pinned_adapters(tmp_path):
    run_dir = tmp_path / "run"
    hashes = pinned_run(run_dir)
    assert yaml.safe_load((run_dir / "recipe.yaml").read_text())["runtime"] == {"cpu_isa": "avx2", "threads": 1}
    assert hashes == PINNED_ADAPTERS, (
        "this CPU does not reproduce the pinned seed-0 run (or a change altered what a step computes: "
        "re-pin with `python -m tests.core.test_cross_cpu`)"
    )


def test_the_cpu_bases_recipes_pin_avx2_and_the_others_stay_native():
    for recipe in sorted((REPO / "recipes").glob("*.yaml")):
        model, _ = load_recipe(recipe)
        # the recipes of the bases that run on a CPU (nano, the arithmetic world's arith_nano)
        expected = "avx2" if recipe.name.startswith(("nano", "arith")) else "native"
        assert model.runtime.cpu_isa == expected, recipe.name


def test_cpu_isa_must_be_a_known_path():
    with pytest.raises(RecipeError, match=r"runtime\.cpu_isa"):
        load_recipe(RECIPE, ["runtime.cpu_isa=avx512"])
    result = run_cli("validate", str(RECIPE), "runtime.cpu_isa=avx512")
    assert result.returncode == 2 and "runtime.cpu_isa" in result.stderr and "Traceback" not in result.stderr


def test_apply_cpu_isa_sets_the_paths_before_torch_and_refuses_after(monkeypatch):
    avx2, _ = load_recipe(RECIPE, ["runtime.threads=null"])
    for var in CPU_VARS:  # set, then deleted: monkeypatch restores a variable only if it saw it
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    monkeypatch.setitem(sys.modules, "torch", object())  # as in a process that already imported torch
    with pytest.warns(UserWarning, match="torch is already imported"):
        assert apply_cpu_isa(avx2.runtime) == {}
    assert all(var not in os.environ for var in CPU_VARS)
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    with pytest.warns(UserWarning, match="runtime.cpu_isa=avx2: MKL_CBWR=COMPATIBLE in the environment replaced"):
        assert apply_cpu_isa(avx2.runtime) == CPU_ISA_ENV["avx2"]
    assert {var: os.environ[var] for var in CPU_VARS} == CPU_ISA_ENV["avx2"]
    native, _ = load_recipe(RECIPE, ["runtime.cpu_isa=native", "runtime.threads=null"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert apply_cpu_isa(native.runtime) == {}


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def test_runtime_threads_set_once_before_torch_loads_or_in_torch_after(monkeypatch):
    """The recipe's ``runtime.threads`` reaches torch (and the processes the run starts) without the Makefile
    (apply_threads: what start_run, resume_run and ``populora seed`` call)."""
    import torch

    recipe, _ = load_recipe(RECIPE, ["runtime.cpu_isa=native", "runtime.threads=3"])
    for var in THREAD_VARS:
        monkeypatch.setenv(var, "1")
    monkeypatch.delitem(sys.modules, "torch")  # not imported yet: the environment, read when torch loads
    with pytest.warns(
        UserWarning, match=r"runtime.threads=3: OMP_NUM_THREADS=1, MKL_NUM_THREADS=1 in the environment replaced"
    ):
        assert apply_threads(recipe.runtime) == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}
    assert [os.environ[v] for v in THREAD_VARS] == ["3", "3"]
    monkeypatch.setitem(sys.modules, "torch", torch)  # already imported: torch itself, and the environment
    before = torch.get_num_threads()
    try:
        recipe2, _ = load_recipe(RECIPE, ["runtime.cpu_isa=native", "runtime.threads=2"])
        with pytest.warns(
            UserWarning, match="runtime.threads=2: OMP_NUM_THREADS=3, MKL_NUM_THREADS=3 in the environment replaced"
        ):
            apply_threads(recipe2.runtime)
        assert torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"
    finally:
        torch.set_num_threads(before)
    with pytest.raises(RecipeError, match=r"runtime\.threads"):
        load_recipe(RECIPE, ["runtime.threads=0"])


def test_no_component_sets_the_thread_count_but_the_core_runtime():
    """One owner: torch.set_num_threads appears only in populora_core/services/runtime.py (plugins call its
    functions)."""
    callers = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in [*(REPO / "populora_core").rglob("*.py"), *(REPO / "plugins").rglob("*.py")]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in ("set_num_threads", "set_num_interop_threads")
    ]
    assert callers and all(c.startswith("populora_core/services/runtime.py:") for c in callers), callers


if __name__ == "__main__":  # re-pin: print the constant from a fresh run
    with tempfile.TemporaryDirectory(prefix="populora-cross-cpu-") as tmp:
        pinned = pinned_run(Path(tmp) / "run")
    print("PINNED_ADAPTERS: dict[str, str] = {")
    for name, digest in pinned.items():
        print(f'    "{name}": "{digest}",')
    print("}")
