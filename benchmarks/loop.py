"""Benchmark: wall time per co-evolution step split by phase, and the orchestration share.

    python -m benchmarks.loop            # the nano CPU recipe, 6 steps (one evolution, one checkpoint)
    python -m benchmarks.loop --quick    # 3 steps, smaller rollouts, evolution at step 2 (< 1 min idle)
    python -m benchmarks.loop --smoke    # 2 steps, tiny rollouts, evolution after step 1 (CI: does it run)

Model compute = generation (propose, solve, buffer) and the policy updates; orchestration = everything
else (matchmaking, prompt building, sandbox validation and grading, ratings, buffers, logging,
evolution, checkpoints). The first step is reported but excluded from the averages (it pays one-off
warm-up costs: sandbox zygotes, model load). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "nano.yaml"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--smoke", action="store_true", help="2 steps of tiny rollouts: checks every phase runs, not its speed"
    )
    parser.add_argument("overrides", nargs="*", help="extra key.sub=value recipe overrides")
    args = parser.parse_args(argv)

    from populora_core.loop import execute, start_run
    from populora_core.metrics import MODEL_PHASES
    from populora_core.plugins import get_manager
    from populora_core.recipe import load_recipe
    from populora_core.run import RunDir

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
    manager = get_manager()
    recipe, resolved = load_recipe(args.recipe, overrides, manager.registry)
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        start = time.perf_counter()
        run = start_run(recipe, resolved, RunDir(Path(tmp) / "run"), manager)
        setup_s = time.perf_counter() - start
        execute(run)
        records = [r for r in RunDir(Path(tmp) / "run").read_log("events.jsonl") if r["event"] == "step"]

    phases = sorted({k[5:] for r in records for k in r if k.startswith("time/")} - {"step", "orchestration_share"})
    print(f"{'phase':<20}" + "".join(f"{'step ' + str(r['step']):>10}" for r in records) + f"{'kind':>16}")
    for phase in phases:
        kind = "model" if phase in MODEL_PHASES else "orchestration"
        print(f"{phase:<20}" + "".join(f"{r.get('time/' + phase, 0.0):>10.3f}" for r in records) + f"{kind:>16}")
    print(f"{'total':<20}" + "".join(f"{r['time/step']:>10.3f}" for r in records))
    steady = records[1:] or records
    total = sum(r["time/step"] for r in steady)
    model = sum(r.get(f"time/{p}", 0.0) for r in steady for p in MODEL_PHASES)
    result = {
        "benchmark": "loop",
        "recipe": Path(args.recipe).name,
        "steps": len(records),
        "setup_s": round(setup_s, 3),
        "seconds_per_step": round(total / len(steady), 3),
        "orchestration_share": round((total - model) / total, 4),
        "model_share": round(model / total, 4),
        "first_step_s": round(records[0]["time/step"], 3),
        "phase_s_per_step": {p: round(statistics.fmean(r.get(f"time/{p}", 0.0) for r in steady), 4) for p in phases},
        "quick": args.quick,
        "smoke": args.smoke,
    }
    print(
        f"orchestration share {result['orchestration_share']:.1%} of {result['seconds_per_step']:.2f} s/step "
        f"(target <= 10%); first step {result['first_step_s']:.2f} s excluded",
        file=sys.stderr,
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
