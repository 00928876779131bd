"""Benchmark: resident memory of one shared base + N adapters (N = 1, 4, 8, 16) against the base alone.

    python -m benchmarks.memory            # hidden 1024, 4 layers, rank 16 on 7 modules (~3.8 MB per adapter)
    python -m benchmarks.memory --quick    # hidden 1024, 2 layers (~1.9 MB per adapter, < 1 min)

Adapters are loaded through the ``hf`` engine into the process-wide ModelHost exactly as in a run
(one generate call each, so every version is really resident). Memory is the process RSS after
``gc.collect()`` and glibc ``malloc_trim(0)`` (freed file buffers would otherwise stay counted).
``overhead_ratio_16`` = measured extra RSS for 16 adapters / (16 x adapter size), adapter size =
the bytes of its tensors as held (fp32 here). Target: <= 1.10. The adapter files are written by a
child process first, so nothing from creating them is counted. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident memory (``VmHWM``: its peak) after a collection and a malloc trim."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def make_files(work: Path, hidden: int, layers: int, count: int, rank: int) -> None:
    """Child process: the model and ``count`` adapter directories (random A, non-zero B)."""
    from benchmarks.tiny_model import build_tiny_model
    from populora_core.services.adapters import init_lora, save_lora

    base = build_tiny_model(work / "model", hidden=hidden, layers=layers, heads=hidden // 64, kv_heads=1)
    for i in range(count):
        w = init_lora(str(base), rank=rank, alpha=2.0 * rank, target_modules=TARGETS, seed=i, init_std=0.02)
        save_lora(w, work / f"m{i}")


def run(quick: bool, device: str, work: Path) -> dict[str, Any]:
    hidden, layers, rank = (1024, 2, 16) if quick else (1024, 4, 16)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.memory",
            "--make-files",
            str(work),
            "--hidden",
            str(hidden),
            "--layers",
            str(layers),
            "--rank",
            str(rank),
        ],
        check=True,
    )
    import torch

    from populora_core.api import get_registry
    from populora_core.api.components import AdapterRef, BaseModel, GenerationRequest, LoraSettings, SamplingParams

    comp = get_registry().get("engine", "hf")
    lora = LoraSettings(rank=rank, alpha=2.0 * rank, target_modules=TARGETS)
    base = BaseModel(str(work / "model"))
    engine = comp.build({"device": device, "max_loaded_adapters": 64}, base_model=base, lora=lora, seed=0)
    tiny = SamplingParams(temperature=0.0, max_tokens=1)
    import safetensors.torch  # noqa: F401  (library code is loaded once per process, not per adapter)

    engine.generate([GenerationRequest("x", None)], tiny)  # warm the base path and allocator
    engine.generate([GenerationRequest("x", None)], tiny)
    cuda = engine.host.device.startswith("cuda")

    def measure() -> int:  # GPU: allocated device memory; CPU: process RSS
        if cuda:
            gc.collect()
            torch.cuda.synchronize()
            return int(torch.cuda.memory_allocated())
        return rss_bytes()

    base_rss = measure()
    adapter_bytes = None
    rows: dict[str, Any] = {}
    loaded = 0
    for n in (1, 4, 8, 16):
        while loaded < n:
            ref = AdapterRef(f"m{loaded}@v0", str(work / f"m{loaded}"))
            engine.generate([GenerationRequest("x", ref)], tiny)
            loaded += 1
            if adapter_bytes is None:
                held = engine.host.version(engine.host.ensure(ref))
                adapter_bytes = sum(
                    a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in held.values()
                )
        assert adapter_bytes is not None  # set by the first adapter loaded
        extra = measure() - base_rss
        rows[str(n)] = {"extra_mb": round(extra / 2**20, 3), "ratio": round(extra / (n * adapter_bytes), 4)}
    assert adapter_bytes is not None
    model_bytes = sum(
        p.numel() * p.element_size() for n, p in engine.host.model.named_parameters() if ".lora_" not in n
    )
    return {
        "benchmark": "memory",
        "quick": quick,
        "device": engine.host.device,
        "torch": torch.__version__,
        "hidden": hidden,
        "layers": layers,
        "rank": rank,
        "target_modules": list(TARGETS),
        "base_params_mb": round(model_bytes / 2**20, 3),
        "measured": "cuda_allocated" if cuda else "rss",
        "mem_with_base_mb": round(base_rss / 2**20, 1),
        "adapter_mb": round(adapter_bytes / 2**20, 4),
        "per_n": rows,
        "overhead_ratio_16": rows["16"]["ratio"],
        "target_overhead_ratio_16": 1.10,
        "meets_target": rows["16"]["ratio"] <= 1.10,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--make-files", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--hidden", type=int, default=512, help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=16, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.make_files:
        make_files(Path(args.make_files), args.hidden, args.layers, 16, args.rank)
        return
    with tempfile.TemporaryDirectory(prefix="bench-mem-") as tmp:
        result = run(args.quick, args.device, Path(tmp))
    result.update(python=platform.python_version(), machine=platform.machine(), cpus=os.cpu_count())
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
