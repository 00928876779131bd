"""Benchmark: a nano co-evolution step by phase, against the reference code path and the machine's matmul speed.

    python -m benchmarks.loop            # the nano CPU recipe, 6 steps of each path, alternating
    python -m benchmarks.loop --quick    # 3 steps each, smaller rollouts, evolution at step 2
    python -m benchmarks.loop --smoke    # 2 steps each, tiny rollouts (CI: does it run)
    python -m benchmarks.loop --no-reference   # the current path only
    python -m benchmarks.loop --no-reference --steps 2 --profile   # + where step 2's time goes, by op and function

Two runs of the same recipe and seed step in turn in one process: the current code path and the reference
(``engine.decode=generate``: transformers' ``generate``; ``trainer.sequence_layout=split``: TRL's padded
layout; ``trainer.lora_forward=peft``: PEFT's LoRA layers; ``trainer.parallel_updates=1``: one member at a
time; ``engine.parallel_batches=1``: one decoding thread), so both see the same machine at the same time.
Their samples differ (the two paths draw different random streams), so each run's tokens are counted and
the FLOPs it needed come from the model shape and those tokens (:func:`step_flops`); ``flops_efficiency`` =
needed FLOPs / (step time x the machine's matmul FLOP/s, all cores, measured in the run). The first step of each
run is reported but excluded from the averages (one-off warm-up). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
REFERENCE = [
    "engine.params.decode=generate",
    "trainer.params.sequence_layout=split",
    "trainer.params.lora_forward=peft",
    "trainer.params.parallel_updates=1",
    "engine.params.parallel_batches=1",
]


def matmul_flops(size: int = 2048, repeats: int = 5) -> float:
    """The machine's matmul speed: the best FLOP/s of an fp32 ``size`` x ``size`` matmul on all its cores.

    All cores, not torch's thread count of the run: a step that uses a second core (parallel_updates) is
    measured against what both can do, and a one-thread path counts the idle core as lost.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        a @ b
        best = min(_timed(lambda: a @ b) for _ in range(repeats))
    finally:
        torch.set_num_threads(threads)
    return 2 * size**3 / best


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def forward_flops(arch: Any, rank: int, tokens: int, keys_attended: int, head_tokens: int) -> float:
    """FLOPs of a forward over ``tokens`` tokens that attend to ``keys_attended`` keys in all, with logits at
    ``head_tokens`` of them: the decoder's linears, the LoRA factors, QK^T and PV, and the LM head."""
    q = arch.heads * arch.head_dim
    kv = arch.kv_heads * arch.head_dim
    per_layer = arch.hidden * (2 * q + 2 * kv) + 3 * arch.hidden * arch.intermediate
    linear = 2 * tokens * arch.layers * per_layer
    lora = 2 * tokens * rank * sum(n * (d_in + d_out) for n, d_in, d_out in arch.targets.values())
    attention = 4 * arch.layers * q * keys_attended
    return linear + lora + attention + 2 * head_tokens * arch.hidden * arch.vocab


def step_flops(arch: Any, rank: int, generated: list[tuple[int, list[int]]], trained: list[tuple[int, int]]) -> float:
    """FLOPs one step needs: each request's prompt once and each sample's tokens (``generated``: (prompt length,
    completion lengths)); each trained sequence's forward and backward (``trained``: (prompt, completion)).

    Backward through the frozen base is the input gradient (the forward's linear FLOPs again) plus twice the
    attention and LoRA FLOPs (their input and weight gradients); the LM head's input gradient at the
    completion tokens.
    """
    total = 0.0
    for p, completions in generated:
        total += forward_flops(arch, rank, p, p * (p + 1) // 2, 1)
        for c in completions:
            total += forward_flops(arch, rank, c, c * p + c * (c + 1) // 2, c)
    for p, c in trained:
        n = p + c
        fwd = forward_flops(arch, rank, n, n * (n + 1) // 2, c)
        attention_lora = forward_flops(arch, rank, n, n * (n + 1) // 2, 0) - forward_flops(arch, 0, n, 0, 0)
        total += 2 * fwd + 2 * attention_lora
    return total


class TokenCounter:
    """Counts what a run's engine generated and its trainer trained, per step."""

    def __init__(self, run: Any) -> None:
        self.generated: list[tuple[int, list[int]]] = []
        self.trained: list[tuple[int, int]] = []
        generate = run.components.engine.generate

        def counted_generate(requests: Any, sampling: Any) -> Any:
            out = generate(requests, sampling)
            for row in out:
                if row and not row[0].dropped:
                    self.generated.append((len(row[0].prompt_token_ids), [len(c.token_ids) for c in row]))
            return out

        def count(rollouts: Any) -> None:
            for r in rollouts:
                if r.completion_token_ids:
                    self.trained.append((len(r.prompt_token_ids), len(r.completion_token_ids)))

        run.components.engine.generate = counted_generate
        # the loop hands the trainer the whole step through update_many
        update_many = run.components.trainer.update_many

        def counted_update_many(jobs: Any) -> Any:
            for job in jobs:
                count(job.rollouts)
            return update_many(jobs)

        run.components.trainer.update_many = counted_update_many

    def take(self) -> tuple[list[tuple[int, list[int]]], list[tuple[int, int]]]:
        out = (self.generated, self.trained)
        self.generated, self.trained = [], []
        return out


def _profiled(step: Any) -> Any:
    """``step()`` under torch.profiler and cProfile; prints the top ops by self CPU time and the top functions."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity, profile

    python = cProfile.Profile()
    with profile(activities=[ProfilerActivity.CPU]) as ops:
        python.enable()
        out = step()
        python.disable()
    print(ops.key_averages().table(sort_by="self_cpu_time_total", row_limit=20), file=sys.stderr)
    pstats.Stats(python, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    return out


def _summary(records: list[dict[str, Any]], flops: list[float], gen: list[int], train: list[int], peak: float) -> dict:
    from populora_core.cli.driver import MODEL_PHASES

    steady = list(range(1, len(records))) or [0]
    total = sum(records[i]["time/step"] for i in steady)
    model = sum(records[i].get(f"time/{p}", 0.0) for i in steady for p in MODEL_PHASES)
    gen_s = sum(records[i].get(f"time/{p}", 0.0) for i in steady for p in MODEL_PHASES if p.startswith("generate"))
    train_s = sum(records[i].get("time/train", 0.0) for i in steady)
    phases = sorted({k[5:] for r in records for k in r if k.startswith("time/")} - {"step", "orchestration_share"})
    return {
        "step_s": round(total / len(steady), 3),
        "first_step_s": round(records[0]["time/step"], 3),
        "orchestration_share": round((total - model) / total, 4),
        "flops_efficiency": round(sum(flops[i] for i in steady) / (total * peak), 5),
        "gflop_per_step": round(statistics.fmean(flops[i] for i in steady) / 1e9, 2),
        "gen_tokens_per_s": round(sum(gen[i] for i in steady) / max(gen_s, 1e-9), 1),
        "train_tokens_per_s": round(sum(train[i] for i in steady) / max(train_s, 1e-9), 1),
        "phase_s_per_step": {
            p: round(statistics.fmean(records[i].get(f"time/{p}", 0.0) for i in steady), 4) for p in phases
        },
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "nano.yaml"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--smoke", action="store_true", help="2 steps of tiny rollouts: checks every phase runs, not its speed"
    )
    parser.add_argument("--no-reference", action="store_true", help="time the current code path only")
    parser.add_argument(
        "--profile", action="store_true", help="profile the current path's last step (torch ops and Python functions)"
    )
    parser.add_argument("overrides", nargs="*", help="extra key.sub=value recipe overrides (both runs)")
    args = parser.parse_args(argv)

    import torch

    from populora_core.cli import driver
    from populora_core.services.architecture import load_arch

    steps = 2 if args.smoke else 3 if args.quick else args.steps
    overrides = [f"steps={steps}", "probe.enabled=false"]
    if args.smoke:
        overrides += [
            "rollout.proposals_per_teacher=1",
            "rollout.solver_samples=2",
            "rollout.propose_max_tokens=64",
            "rollout.solve_max_tokens=32",
            "evolution.every=1",
        ]
    elif args.quick:
        overrides += ["rollout.proposals_per_teacher=2", "rollout.solver_samples=2", "evolution.every=2"]
    overrides += args.overrides
    paths = {"current": overrides} if args.no_reference else {"current": overrides, "reference": overrides + REFERENCE}
    peak = matmul_flops()
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        runs, counters = {}, {}
        for name, ov in paths.items():
            recipe, resolved = driver.load_recipe(args.recipe, ov)
            runs[name] = driver.start_run(recipe, resolved, Path(tmp) / name)
            counters[name] = TokenCounter(runs[name])
        recipe = runs["current"].recipe
        base = runs["current"].components.base_model
        arch = load_arch(Path(base.path) / "config.json", list(recipe.lora.target_modules))
        records: dict[str, list[dict[str, Any]]] = defaultdict(list)
        flops: dict[str, list[float]] = defaultdict(list)
        gen_tokens: dict[str, list[int]] = defaultdict(list)
        train_tokens: dict[str, list[int]] = defaultdict(list)
        try:
            for step in range(1, steps + 1):
                for name, run in runs.items():
                    if args.profile and name == "current" and step == steps:
                        records[name].append(_profiled(run.run_step))
                    else:
                        records[name].append(run.run_step())
                    generated, trained = counters[name].take()
                    flops[name].append(step_flops(arch, recipe.lora.rank, generated, trained))
                    gen_tokens[name].append(sum(sum(c) for _, c in generated))
                    train_tokens[name].append(sum(p + c for p, c in trained))
        finally:
            for run in runs.values():
                run.close()
        peak = max(peak, matmul_flops())  # the machine's best seen during the run (before and after)

    current = records["current"]
    phases = sorted({k[5:] for r in current for k in r if k.startswith("time/")} - {"step", "orchestration_share"})
    for name in runs:
        print(f"[{name}]")
        print(f"{'phase':<20}" + "".join(f"{'step ' + str(r['step']):>10}" for r in records[name]) + f"{'kind':>16}")
        for phase in phases:
            kind = "model" if phase in driver.MODEL_PHASES else "orchestration"
            row = "".join(f"{r.get('time/' + phase, 0.0):>10.3f}" for r in records[name])
            print(f"{phase:<20}" + row + f"{kind:>16}")
        print(f"{'total':<20}" + "".join(f"{r['time/step']:>10.3f}" for r in records[name]))
    summaries = {
        name: _summary(records[name], flops[name], gen_tokens[name], train_tokens[name], peak) for name in runs
    }
    now = summaries["current"]
    result: dict[str, Any] = {
        "benchmark": "loop",
        "recipe": Path(args.recipe).name,
        "steps": steps,
        "threads": torch.get_num_threads(),
        "matmul_gflops": round(peak / 1e9, 1),
        "nano_step_s": now["step_s"],
        "flops_efficiency": now["flops_efficiency"],
        "gen_tokens_per_s": now["gen_tokens_per_s"],
        "train_tokens_per_s": now["train_tokens_per_s"],
        "orchestration_share": now["orchestration_share"],
        "current": now,
        "quick": args.quick,
        "smoke": args.smoke,
    }
    if "reference" in summaries:
        ref = summaries["reference"]
        result["speedup_vs_reference"] = round(ref["step_s"] / now["step_s"], 3)
        result["reference_flops_efficiency"] = ref["flops_efficiency"]
        result["reference"] = ref
    print(
        f"current {now['step_s']:.2f} s/step, flops efficiency {now['flops_efficiency']:.2%} of "
        f"{peak / 1e9:.0f} GFLOP/s; generation {now['gen_tokens_per_s']:.0f} tok/s, training "
        f"{now['train_tokens_per_s']:.0f} tok/s"
        + (
            f"; reference {result['reference']['step_s']:.2f} s/step "
            f"({result['reference_flops_efficiency']:.2%}): speedup {result['speedup_vs_reference']:.2f}x (target >= 2)"
            if "reference" in result
            else ""
        ),
        file=sys.stderr,
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
