"""Benchmark: tokens/s of ``trr++`` updates (and ``grpo`` for comparison) on the shared base.

    python -m benchmarks.training            # 64 rollouts x 64 completion tokens, 8 members, 3 rounds
    python -m benchmarks.training --quick    # 32 rollouts x 32 tokens, 4 members, 1 round (< 1 min)
    python -m benchmarks.training --device cuda   # on a GPU: bf16 base, fp32 adapters

Each update: load the member's current version into the scratch slot, forward/backward over its
rollouts in micro-batches, one AdamW step, write the new version to disk, exactly as the loop does.
Rollouts are synthetic token ids (the cost of an update does not depend on what the tokens are);
prompt lengths vary. ``trr_tokens_per_s`` = completion tokens trained / wall time of the updates,
the first (warm-up) update excluded. Last line: one JSON object.

    python -m benchmarks.training --logprob-memory   # peak memory of the trr++ log-prob path, full vs chunked

``--logprob-memory``: one real ``trr++`` update (forward, log-probs, entropy, backward, AdamW step) of one
rollout with a 4,096-token completion on a random 2-layer Llama with hidden size 64 and Qwen2.5's vocabulary
of 152,064, so the log-prob path dominates and it runs on a CPU. Each variant runs in its own interpreter:
``full`` (``logprob_chunk_tokens: null``, the one-piece computation) and ``chunked`` (``--chunk`` tokens,
default 1024). Peak = the process's high-water RSS after the update (``ru_maxrss``) minus its RSS just
before it, on CUDA ``torch.cuda.max_memory_allocated`` minus the allocation before (and the reserved peak,
``torch.cuda.max_memory_reserved`` minus the reserved before: allocated plus the allocator's fragmentation, as
``*_reserved_mib``). Reported:
``logprob_peak_ratio`` (full / chunked peak) and ``logprob_max_abs_diff`` (largest |full - chunked|
per-token log-prob of the update), plus the entropy, loss and gradient (before the step) differences.
With ``--quick`` it runs a tiny vocabulary in this process (differences only, no peaks); plain
``--quick`` checks the same tiny case in-process after the throughput runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _rollouts(member: str, n: int, length: int, seed: int) -> list[Any]:
    from populora_core.api.components import Rollout

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
    from benchmarks.tiny_model import fresh_adapter
    from populora_core.api import get_registry
    from populora_core.api.components import AdapterRef, BaseModel, LoraSettings

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


VOCAB = 152_064  # Qwen2.5-7B's vocabulary


def _logprob_model(work: Path, vocab: int) -> None:
    """The tiny tokenizer with a random 2-layer, hidden-64 Llama of ``vocab`` ids; a version-0 adapter."""
    from transformers import AutoConfig, LlamaForCausalLM

    from benchmarks.tiny_model import build_tiny_model, fresh_adapter
    from populora_core.api.components import BaseModel, LoraSettings

    path = build_tiny_model(work / "model", hidden=64, layers=2, heads=4, kv_heads=2, max_positions=8192)
    config = AutoConfig.from_pretrained(path)
    config.vocab_size = vocab
    LlamaForCausalLM(config).save_pretrained(path)
    fresh_adapter(
        BaseModel(str(path)), "lp@v0", LoraSettings(rank=8, alpha=16.0, init_std=0.02), seed=0, out_dir=work / "v0"
    )


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def logprob_variant(work: Path, variant: str, chunk: int, tokens: int, device: str) -> dict[str, Any]:
    """One trr++ update of one ``tokens``-token completion (``variant`` full or chunked) and its peak memory; the
    update's log-probs, entropy and gradient (before the step) are saved to ``work/<variant>.pt``."""
    import populora_trainers.trr as trr_module
    import torch

    from populora_core.api import get_registry
    from populora_core.api.components import AdapterRef, BaseModel, LoraSettings, Rollout

    base = BaseModel(str(work / "model"))
    lora = LoraSettings(rank=8, alpha=16.0, init_std=0.02)
    params = {
        "device": device,
        "lr": 1e-3,
        "normalize": "none",  # one rollout: its raw reward is the advantage, so the policy term has a gradient
        "logprob_chunk_tokens": None if variant == "full" else chunk,
        "gradient_checkpointing": "off",
    }
    trainer = get_registry().get("trainer", "trr++").build(params, base_model=base, lora=lora, seed=0)
    v0 = AdapterRef("lp@v0", str(work / "v0"))
    rng = random.Random(0)
    prompt = [rng.randrange(3, 300) for _ in range(64)]
    rollout = Rollout("m", "deduction/solve", prompt, [rng.randrange(3, 300) for _ in range(tokens)], [], 1.0)
    warm = Rollout("warm", "deduction/solve", prompt, rollout.completion_token_ids[:8], [], 1.0)
    trainer.update("warm", v0, [warm], work / f"{variant}_warm")  # lazy imports, optimizer, allocator
    seen: dict[str, Any] = {}
    token_logprobs, step = trr_module.token_logprobs, trainer._step

    def recording_logprobs(*args: Any, **kwargs: Any) -> Any:
        lp, ent = token_logprobs(*args, **kwargs)
        seen.setdefault("logp", lp.detach().cpu())
        seen.setdefault("entropy", ent.detach().cpu())
        return lp, ent

    def recording_step(member_id: str, opt: Any, params: dict[str, Any]) -> Any:
        seen["grad"] = torch.cat([t.grad.detach().flatten().cpu() for t in params.values()])
        return step(member_id, opt, params)

    trr_module.token_logprobs, trainer._step = recording_logprobs, recording_step  # tensors of (1, tokens) only
    cuda = trainer.host.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before, reserved_before = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    else:
        before, maxrss_before = _rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    stats = trainer.update("m", v0, [rollout], work / f"{variant}_v1")
    seconds = time.perf_counter() - start
    if cuda:
        torch.cuda.synchronize()
        peak, method = torch.cuda.max_memory_allocated() - before, "torch.cuda.max_memory_allocated"
        reserved = torch.cuda.max_memory_reserved() - reserved_before  # the allocator's segments: fragmentation too
    else:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        peak, method = maxrss - before, "ru_maxrss after - RSS before (own process)"
        reserved = None  # no caching allocator on the CPU
        if maxrss <= maxrss_before:
            method += "; not above the earlier high-water mark, so an upper bound"
    trr_module.token_logprobs = token_logprobs
    torch.save(seen, work / f"{variant}.pt")
    host = trainer.host
    return {
        "variant": variant,
        "peak_bytes": int(peak),
        "peak_method": method,
        "peak_reserved_bytes": None if reserved is None else int(reserved),
        "loss": stats.loss,
        "entropy": stats.entropy,
        "grad_norm": stats.grad_norm,
        "seconds": round(seconds, 2),
        "device": host.device,
    }


def _compare(work: Path, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    import torch

    full, chunked = torch.load(work / "full.pt", weights_only=True), torch.load(work / "chunked.pt", weights_only=True)
    return {
        "logprob_max_abs_diff": float((full["logp"] - chunked["logp"]).abs().max()),
        "entropy_max_abs_diff": float((full["entropy"] - chunked["entropy"]).abs().max()),
        "loss_abs_diff": abs(runs["full"]["loss"] - runs["chunked"]["loss"]),
        "grad_norm_rel_diff": abs(runs["full"]["grad_norm"] - runs["chunked"]["grad_norm"]) / runs["full"]["grad_norm"],
        "grad_max_abs_diff": float((full["grad"] - chunked["grad"]).abs().max()),
        "grad_rel_diff": float((full["grad"] - chunked["grad"]).norm() / full["grad"].norm()),
    }


def logprob_memory(quick: bool, device: str, chunk: int) -> dict[str, Any]:
    """Full vs chunked log-probs: each variant in its own interpreter (peaks), or tiny in-process (``quick``)."""
    vocab, tokens = (8192, 256) if quick else (VOCAB, 4096)
    chunk = min(chunk, 64) if quick else chunk
    with tempfile.TemporaryDirectory(prefix="bench-logprob-") as tmp:
        work = Path(tmp)
        _logprob_model(work, vocab)
        runs: dict[str, dict[str, Any]] = {}
        for variant in ("full", "chunked"):
            if quick:
                runs[variant] = logprob_variant(work, variant, chunk, tokens, device)
                continue
            cmd = [sys.executable, "-m", "benchmarks.training", "--logprob-variant", variant, "--work", str(work)]
            cmd += ["--device", device, "--chunk", str(chunk)]
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
            if done.returncode != 0:
                raise RuntimeError(f"logprob variant {variant} failed:\n{done.stderr[-3000:]}")
            runs[variant] = json.loads(done.stdout.strip().splitlines()[-1])
        out: dict[str, Any] = {
            "vocab": vocab,
            "completion_tokens": tokens,
            "chunk_tokens": chunk,
            **_compare(work, runs),
        }
    if quick:
        out["peaks"] = "not measured in --quick (both variants share one process)"
    else:
        out["full"], out["chunked"] = runs["full"], runs["chunked"]
        out["full_peak_mib"] = round(runs["full"]["peak_bytes"] / 2**20, 1)
        out["chunked_peak_mib"] = round(runs["chunked"]["peak_bytes"] / 2**20, 1)
        for variant in ("full", "chunked"):  # on CUDA: the allocator's segments too (what fragmentation costs)
            if runs[variant]["peak_reserved_bytes"] is not None:
                out[f"{variant}_reserved_mib"] = round(runs[variant]["peak_reserved_bytes"] / 2**20, 1)
        out["logprob_peak_ratio"] = round(runs["full"]["peak_bytes"] / max(1, runs["chunked"]["peak_bytes"]), 2)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--no-grpo", action="store_true")
    ap.add_argument("--logprob-memory", action="store_true", help="peak memory of the log-prob path, full vs chunked")
    ap.add_argument("--chunk", type=int, default=1024, help="logprob_chunk_tokens of the chunked variant")
    ap.add_argument("--logprob-variant", choices=("full", "chunked"), help=argparse.SUPPRESS)  # one measured child
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.logprob_variant:
        result: dict[str, Any] = logprob_variant(Path(args.work), args.logprob_variant, args.chunk, 4096, args.device)
        print(json.dumps(result), flush=True)
        return
    if args.logprob_memory:
        result = {"benchmark": "training", "mode": "logprob_memory", "quick": args.quick}
        result.update(logprob_memory(args.quick, args.device, args.chunk))
        print(json.dumps(result), flush=True)
        return
    import torch

    from benchmarks.tiny_model import build_tiny_model
    from populora_core.services.modelhost import get_host

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        work = Path(tmp)
        build_tiny_model(work / "model", hidden=128, heads=2, kv_heads=1)
        result = {"benchmark": "training", "quick": args.quick}
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
        from populora_core.api.components import BaseModel

        host = get_host(BaseModel(str(work / "model")), args.device)
        result.update(
            device=host.device,
            dtype=str(host.dtype),
            threads=torch.get_num_threads(),
            python=platform.python_version(),
            machine=platform.machine(),
            cpus=os.cpu_count(),
        )
    if args.quick:  # the log-prob comparison, tiny and in-process (peaks: --logprob-memory)
        result["logprob_check"] = logprob_memory(True, args.device, args.chunk)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
