"""Benchmark: tokens/s of ``trr++`` updates (and ``grpo`` for comparison) on the shared base.

    python -m benchmarks.training            # 64 rollouts x 64 completion tokens, 8 members, 3 rounds
    python -m benchmarks.training --quick    # 32 rollouts x 32 tokens, 4 members, 1 round (< 1 min)
    python -m benchmarks.training --device cuda   # on a GPU: bf16 base, fp32 adapters

Each update: load the member's current version into the scratch slot, forward/backward over its
rollouts in micro-batches, one AdamW step, write the new version to disk, exactly as the loop does.
Rollouts are synthetic token ids (the cost of an update does not depend on what the tokens are);
prompt lengths vary. ``trr_tokens_per_s`` = completion tokens trained / wall time of the updates,
the first (warm-up) update excluded. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _rollouts(member: str, n: int, length: int, seed: int) -> list[Any]:
    from populora_core.components import Rollout

    rng = random.Random(seed)
    groups = [
        "deduction/solve",
        "abduction/solve",
        "induction/solve",
        "deduction/propose",
        "abduction/propose",
        "induction/propose",
    ]
    out = []
    for i in range(n):
        prompt = [rng.randrange(3, 300) for _ in range(rng.randrange(16, 48))]
        comp = [rng.randrange(3, 300) for _ in range(rng.randrange(length // 2, length + 1))]
        out.append(Rollout(member, groups[i % len(groups)], prompt, comp, [-6.0] * len(comp), float(rng.random())))
    return out


def bench(name: str, params: dict[str, Any], quick: bool, device: str, work: Path) -> dict[str, Any]:
    from populora_core import get_registry
    from populora_core.components import AdapterRef, BaseModel, LoraSettings
    from tests.tiny_model import fresh_adapter

    n_rollouts, length, members, rounds = (32, 32, 4, 1) if quick else (64, 64, 8, 3)
    base = BaseModel(str(work / "model"))
    lora = LoraSettings(rank=16, alpha=32.0, init_std=0.02)
    trainer = (
        get_registry().get("trainer", name).build({"device": device, **params}, base_model=base, lora=lora, seed=0)
    )
    # version-0 adapters written as the loop writes them (init_lora + save_lora)
    current = {
        f"m{i}": fresh_adapter(base, f"{name}-m{i}@v0", lora, seed=i, out_dir=work / name / f"m{i}_v0")
        for i in range(members)
    }
    version = 0
    # warm-up: first update of one member (allocations, lazy imports, TRL construction for grpo)
    warm = trainer.update("m0", current["m0"], _rollouts("m0", n_rollouts, length, 0), work / name / "warm")
    tokens = 0
    seconds = 0.0
    stats = []
    for r in range(rounds):
        version += 1
        for m in sorted(current):
            out = work / name / f"{m}_v{version}"
            t = time.perf_counter()
            s = trainer.update(m, current[m], _rollouts(m, n_rollouts, length, 1000 * r + int(m[1:])), out)
            seconds += time.perf_counter() - t
            tokens += s.tokens
            stats.append(s)
            current[m] = AdapterRef(f"{name}-{m}@v{version}", str(out))
    return {
        "tokens_per_s": round(tokens / seconds, 1),
        "updates": len(stats),
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "warmup_s": round(warm.seconds, 3),
        "mean_update_s": round(seconds / len(stats), 4),
        "micro_batch_size": params.get("micro_batch_size", 8),
        "rollouts_per_update": n_rollouts,
        "max_completion_tokens": length,
        "members": members,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--no-grpo", action="store_true")
    args = ap.parse_args(argv)
    import torch

    from populora_core.modelhost import get_host
    from tests.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        work = Path(tmp)
        build_tiny_model(work / "model", hidden=128, heads=2, kv_heads=1)
        result: dict[str, Any] = {"benchmark": "training", "quick": args.quick}
        trr = bench("trr++", {"micro_batch_size": 16}, args.quick, args.device, work)
        result["trr"] = trr
        result["trr_tokens_per_s"] = trr["tokens_per_s"]
        grpo_ok = not args.no_grpo
        if grpo_ok:
            try:
                import trl  # noqa: F401
            except Exception as exc:  # the GPU image has no TRL
                result["grpo_skipped"] = f"{type(exc).__name__}: {exc}"
                grpo_ok = False
        if grpo_ok:
            result["grpo"] = bench("grpo", {"micro_batch_size": 16}, args.quick, args.device, work)
            result["grpo_tokens_per_s"] = result["grpo"]["tokens_per_s"]
        from populora_core.components import BaseModel

        host = get_host(BaseModel(str(work / "model")), args.device)
        result.update(
            device=host.device,
            dtype=str(host.dtype),
            threads=torch.get_num_threads(),
            python=platform.python_version(),
            machine=platform.machine(),
            cpus=os.cpu_count(),
        )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
