"""Benchmark: step time of the nano recipe on 1 and 2 Ray workers against the single process, and Ray's overhead.

    python -m benchmarks.scaling            # nano 2T-2S and a 4T-4S variant: local, 1 and 2 Ray workers (and 2
                                            # through the object store), 4 steps
    python -m benchmarks.scaling --quick    # 3 steps of smaller rollouts
    python -m benchmarks.scaling --smoke    # 2 tiny steps, local and 2 workers of 2T-2S (CI: does it run)

Every configuration runs at one torch thread per process (the single process and each worker), as the
bit-identity of the Ray run needs; the ``threads`` row is the single process using both cores itself
(``parallel_batches`` and ``parallel_updates`` 2: Python threads, the same results). Step time is the mean
of ``time/step`` over the steps after the first (which pays model loading and warm-ups); Ray's start-up
(cluster, actors, base models) is reported apart.
Ray overhead = driver wall time of the remote calls beyond the slowest worker's time inside them
(serialization, scheduling, transfers), as a share of step time. The hf engine is row-seeded, so the
workers split every generation call by token budget and each Ray row's adapters are checked against the
single process's (``identical``: the same sha256 for every adapter). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "nano_ray.yaml"


def measure(overrides: list[str], workdir: Path, label: str) -> dict:
    from populora_core.cli import driver

    recipe, resolved = driver.load_recipe(RECIPE, overrides)
    started = time.perf_counter()
    run = driver.start_run(recipe, resolved, workdir / label)
    startup_s = time.perf_counter() - started
    overhead: dict[int, float] = {}  # the cluster's cumulative Ray overhead at the end of every step

    def record_overhead(metrics: dict[str, Any]) -> None:
        if run.components.cluster is not None:
            # .time is the Ray cluster's timer, not part of the Cluster protocol
            overhead[metrics["step"]] = cast(Any, run.components.cluster).time.overhead_s

    driver.execute(run, on_step=record_overhead)
    # transfer: object_store: bytes the driver put into the store, shipped to workers and fetched back, per step
    moved = dict(getattr(run.components.cluster, "transfer_bytes", {}))
    steps = [e for e in driver.events(workdir / label) if e["event"] == "step"]
    timed = steps[1:] or steps
    step_s = statistics.fmean(s["time/step"] for s in timed)
    train_s = statistics.fmean(s["time/train"] for s in timed)
    generate_s = statistics.fmean(
        sum(s.get(f"time/{p}", 0.0) for p in ("generate_propose", "generate_solve", "generate_buffer")) for s in timed
    )
    first = timed[0]["step"]
    overhead_s = (overhead[timed[-1]["step"]] - overhead.get(first - 1, 0.0)) / len(timed) if overhead else 0.0
    return {
        "config": label,
        "adapters": adapter_hashes(workdir / label),
        "step_s": step_s,
        "generate_s": generate_s,
        "train_s": train_s,
        "ray_overhead_s": overhead_s,
        "startup_s": startup_s,
        "state_moves": dict(
            getattr(run.components.trainer, "state_moves", {})
        ),  # optimizer states moved between workers
        "store_bytes_per_step": {k: v // len(steps) for k, v in moved.items()},
    }


def adapter_hashes(run_dir: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256((p / "adapter_model.safetensors").read_bytes()).hexdigest()
        for p in sorted((run_dir / "adapters").iterdir())
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="2 tiny steps: checks it runs, not its speed")
    args = parser.parse_args(argv)

    import ray

    steps = 2 if args.smoke else 3 if args.quick else args.steps
    common = [f"steps={steps}", "probe.enabled=false", "evolution.every=0", f"checkpoint.every={steps}"]
    if args.smoke:
        common += [
            "rollout.proposals_per_teacher=1",
            "rollout.solver_samples=2",
            "rollout.propose_max_tokens=48",
            "rollout.solve_max_tokens=24",
        ]
    elif args.quick:
        common += ["rollout.proposals_per_teacher=3", "rollout.solver_samples=3"]
    populations = (
        {"2t2s": []} if args.smoke else {"2t2s": [], "4t4s": ["population.teachers=4", "population.students=4"]}
    )
    ray_settings = ["cluster.params.threads_per_worker=1", "cluster.params.cpus_per_worker=1"]
    configs = {
        "local": ["cluster=local"],
        # the single process on both cores: two decoding threads, two members trained at once
        "threads": ["cluster=local", "engine.params.parallel_batches=2", "trainer.params.parallel_updates=2"],
        "ray-1": ["cluster.params.workers=1", *ray_settings],
        "ray-2": ["cluster.params.workers=2", *ray_settings],
        # nodes without a shared filesystem: adapters and checkpoint files through the object store
        "ray-2-store": ["cluster.params.workers=2", "cluster.params.transfer=object_store", *ray_settings],
    }
    if args.smoke:
        configs = {k: v for k, v in configs.items() if k in ("local", "ray-2")}

    # one cluster for every Ray row; ray.init takes a level name too (its stubs say int only)
    # address="local": never the newest `ray start` on this machine (a test's cluster, in CI)
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=cast(Any, "warning"))
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="populora-scaling-") as tmp:
            for population, extra in populations.items():
                for label, settings in configs.items():
                    row = measure(common + extra + settings, Path(tmp), f"{population}-{label}")
                    row["population"] = population
                    hashes = row.pop("adapters")
                    if label == "local":
                        local_hashes = hashes
                    row["identical"] = hashes == local_hashes
                    rows.append(row)
                    store = row["store_bytes_per_step"]
                    print(
                        f"{row['config']:>18}: step {row['step_s']:6.2f} s (generate {row['generate_s']:5.2f}, "
                        f"train {row['train_s']:5.2f}, ray overhead {row['ray_overhead_s']:5.3f}, "
                        f"state moves {sum(row['state_moves'].values())}); "
                        + (f"object store bytes per step {store}; " if store else "")
                        + f"start-up {row['startup_s']:5.1f} s; adapters identical to the single process: "
                        f"{row['identical']}",
                        flush=True,
                    )
    finally:
        ray.shutdown()

    def step_of(population: str, label: str) -> float | None:
        found = [r["step_s"] for r in rows if r["population"] == population and r["config"].endswith(label)]
        return found[0] if found else None

    headline = "2t2s" if args.smoke else "4t4s"
    result: dict[str, Any] = {"benchmark": "scaling", "steps": steps, "rows": rows}
    for population in populations:
        local = step_of(population, "-local")
        for label in ("threads", "ray-1", "ray-2", "ray-2-store"):
            other = step_of(population, f"-{label}")
            if local and other:
                result[f"speedup_{population}_{label.replace('-', '_')}"] = local / other
    two = next(r for r in rows if r["population"] == headline and r["config"].endswith("-ray-2"))
    result["speedup_2_workers"] = result[f"speedup_{headline}_ray_2"]
    result["ray_overhead_share"] = two["ray_overhead_s"] / two["step_s"]
    result["identical"] = all(r["identical"] for r in rows)
    threads = step_of(headline, "-threads")
    if threads:  # Ray's 2 workers against the single process that uses both cores itself
        result["speedup_2_workers_vs_threads"] = threads / two["step_s"]
    print(
        f"{headline}: 2 workers {result['speedup_2_workers']:.2f}x the single process's step rate "
        f"(target 1.6x), Ray overhead {100 * result['ray_overhead_share']:.1f} % of step time (target <= 5 %); "
        f"every Ray run's adapters identical to the single process's: {result['identical']}"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
