"""Benchmark: every LoRA operator on Qwen2.5-7B-shaped adapters, against PEFT's svd merge.

    python -m benchmarks.operators            # 28 layers x 7 modules, ranks 16 and 64 (many minutes)
    python -m benchmarks.operators --quick    # 2 layers of q,k,v,o, rank 16, PEFT on one layer (< 1 min)
    python -m benchmarks.operators --smoke    # 1 layer of k,v, rank 16, PEFT on k_proj, no pip (CI)

Each timing is the median of ``--repeats`` runs (3; one for a call over 5 s, such as the dense merges): one run
of the same call varies by up to 2x on this shared VM.
Parents are synthetic but trained-looking (decaying spectra, A at init scale, B carrying the magnitude;
see populora_lora_ops.synthetic). Per child: wall time and peak extra RSS over the parents already in
memory (sampled every 2 ms). The ``svd`` child is also made end to end in one process (read both
parents' PEFT dirs, operate, write the child: ``svd_child_total_s``, alias ``svd_crossover_io_s``, with
its phases) and by ``populora evolve svd`` in a new process (``svd_evolve_cli_s``, start-up included).
For the ``svd`` crossover, side by side: PEFT's ``add_weighted_adapter(combination_type="svd")`` on
the same parents, timed on ONE layer and extrapolated to all layers (its dense SVD per module takes
tens of seconds at these shapes), and the relative error of both against a dense fp32 reference
(weighted sum, truncated SVD) on that layer.
The ``populora`` package on PyPI (lucidrains) and its runtime requirements (torch excluded) are installed
with --no-deps into a throwaway ``pip --target`` dir, never this venv; its mutations are timed on the same
parents, each beside our mutation that does the same job (LUCID_COUNTERPARTS), and its factor-space
crossovers measured against the true average of the parents' delta W.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

_PAGE = os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Peak resident memory (MB) above the level at entry, sampled by a thread every 2 ms."""

    def __init__(self) -> None:
        self.base = self.peak = 0

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * _PAGE

    def __enter__(self) -> PeakRss:
        self.base = self.peak = self.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())

    @property
    def mb(self) -> float:
        return (self.peak - self.base) / 2**20


_CPU: dict[str, float] = {"last": 0.0}


#: Each timing is the median of this many runs (--repeats): on this shared VM one run of the same call
#: varies by up to 2x. A call that takes over REPEAT_BELOW_S runs once (the dense merges).
_REPEATS = {"n": 3}
REPEAT_BELOW_S = 5.0


def _timed(fn: Any, setup: Any = None) -> tuple[Any, float, float]:
    """(last result, median wall seconds, largest peak extra MB) of ``fn(*setup())`` (setup untimed); the
    median process CPU seconds go to _CPU["last"] (the CPU is shared, so CPU time is the contention-robust
    figure next to wall time)."""
    walls: list[float] = []
    cpus, peaks = [], []
    out = None
    while not walls or (len(walls) < _REPEATS["n"] and walls[0] < REPEAT_BELOW_S):
        args = setup() if setup is not None else ()
        out = None  # the previous result is freed before the next run, so peaks do not add up
        with PeakRss() as mem:
            t0, c0 = time.perf_counter(), time.process_time()
            out = fn(*args)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        peaks.append(mem.mb)
    _CPU["last"] = statistics.median(cpus)
    return out, statistics.median(walls), max(peaks)


def _layer0(names: list[str]) -> list[str]:
    return [n for n in names if ".layers.0." in n]


# --- PEFT ---------------------------------------------------------------------------------------


def peft_svd_one_layer(
    parents: list[Any], names: list[str], shapes: dict[str, tuple[int, int]], weights: list[float]
) -> tuple[dict[str, Any], float]:
    """PEFT's svd merge of two adapters on a one-layer skeleton (base weights never initialised)."""
    import torch
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from torch import nn

    class Skeleton(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = nn.Module()
            layer = nn.Module()
            layer.self_attn, layer.mlp = nn.Module(), nn.Module()
            for key in names:
                sub, mod = key.split(".layers.0.")[1].split(".")
                d_out, d_in = shapes[key]
                setattr(getattr(layer, sub), mod, nn.Linear(d_in, d_out, bias=False))
            self.model.layers = nn.ModuleList([layer])

    with torch.device("meta"):
        skel = Skeleton()
    skel = skel.to_empty(device="cpu").to(torch.bfloat16)  # untouched pages: no RSS for the base weights
    cfg = parents[0].config
    targets = sorted({n.rsplit(".", 1)[-1] for n in names})
    lcfg = LoraConfig(r=cfg["r"], lora_alpha=cfg["lora_alpha"], target_modules=targets, lora_dropout=0.0)
    model = get_peft_model(skel, lcfg, adapter_name="p0")
    model.add_adapter("p1", lcfg)
    for i, p in enumerate(parents):
        sd = {}
        for n in names:
            sd[f"{n}.lora_A.weight"] = p.modules[n].A
            sd[f"{n}.lora_B.weight"] = p.modules[n].B
        set_peft_model_state_dict(model, sd, adapter_name=f"p{i}")
    t0 = time.perf_counter()
    model.add_weighted_adapter(["p0", "p1"], weights, "child", combination_type="svd")
    dt = time.perf_counter() - t0
    deltas = {n: cast(Any, model.get_submodule(n)).get_delta_weight("child").float() for n in names}  # a LoRA layer
    return deltas, dt


# --- lucidrains' populora from PyPI ---------------------------------------------------------------

#: Our mutation -> lucidrains' mutation that does the same job (same M1..M5 of the PopuLoRA recipe).
LUCID_COUNTERPARTS = {
    "svd_structured": "svd_structured",
    "layer_gaussian": "layer_selective_gaussian",
    "component_mask": "component_masking",
    "gaussian": "full_gaussian",
    "neftune": "neftune_style",
}


def _pip_target(target: Path, *specs: str) -> str | None:
    """pip install --no-deps --target; None on success, else pip's last line."""
    try:
        res = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *specs],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        return "pip install timed out"
    return None if res.returncode == 0 else (res.stderr.strip().splitlines() or ["?"])[-1]


def _runtime_requirements(target: Path) -> list[str]:
    """``populora``'s Requires-Dist without extras, torch excluded (ours is used)."""
    reqs = []
    for meta in target.glob("populora-*.dist-info/METADATA"):
        for line in meta.read_text().splitlines():
            if line.startswith("Requires-Dist:") and "extra ==" not in line:
                spec = line.split(":", 1)[1].split(";")[0].strip()
                if not spec.lower().startswith("torch") or spec.lower().startswith("torch-"):
                    reqs.append(spec)
    return reqs


def try_lucidrains(target: str | None, install: bool = True) -> tuple[bool, str]:
    """Install ``populora`` and its runtime requirements (all with --no-deps, torch never) into a throwaway
    --target dir, then import it in a child process; never into this venv. ``install=False``: only use
    what is already there (no pip, no network)."""
    tgt = Path(target or tempfile.mkdtemp(prefix="lucid-populora-"))
    if not (tgt / "populora").is_dir():
        if not install:
            return False, f"not installed in {tgt}, and this mode never runs pip (--quick or a full run installs it)"
        err = _pip_target(tgt, "populora") or _pip_target(tgt, *_runtime_requirements(tgt))
        if err:
            return False, f"pip install failed: {err}"
    code = "import sys; sys.path.insert(0, sys.argv[1]); import populora.operators"
    for _ in range(6):  # requirements of requirements, one missing module at a time
        probe = subprocess.run([sys.executable, "-c", code, str(tgt)], capture_output=True, text=True, timeout=120)
        if probe.returncode == 0:
            return True, str(tgt)
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        missing = last.split("No module named ", 1)[1].strip("'\"").split(".")[0] if "No module named" in last else None
        if missing is None or _pip_target(tgt, missing):
            return False, f"installed with --no-deps but not importable: {last}"
    return False, "not importable after installing six missing modules"


def bench_lucidrains(
    target: str, parents: list[Any], named: dict[str, tuple[int, int]], rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """lucidrains' operators on the same parents: time per child for each mutation, and how far its
    factor-space crossovers (average, DARE on factors) land from the true average of the parents' delta W
    (layer 0). Its population stores down = A^T (pop, d_in, r) and up = B (pop, d_out, r); we fold the
    LoRA scale into up so both sides mean the same delta W."""
    import torch

    if target not in sys.path:
        sys.path.append(target)  # after our own site-packages: its dependencies never shadow ours
    from types import SimpleNamespace

    from populora import operators as lucid

    names = list(named)

    def population(slots: int) -> Any:
        def stack(get: Any) -> dict[str, Any]:
            return {
                n: torch.stack(
                    [get(p.modules[n]) for p in parents]
                    + [torch.zeros_like(get(parents[0].modules[n]))] * (slots - len(parents))
                )
                for n in names
            }

        return SimpleNamespace(
            weight_down=stack(lambda f: f.A.T.contiguous()),
            weight_up=stack(lambda f: f.B * f.scale),
            device=torch.device("cpu"),
        )

    torch.manual_seed(0)  # it draws from torch's global generator
    out: dict[str, Any] = {"mutations_s": {}}
    for name, fn in lucid.MUTATION_REGISTRY.items():
        _, dt, mb = _timed(lambda pop, fn=fn: fn(pop, torch.tensor([0])), setup=lambda: (population(len(parents)),))
        rows.append(
            {
                "operator": f"lucidrains {name}",
                "rank": parents[0].config["r"],
                "seconds": dt,
                "cpu_s": _CPU["last"],
                "peak_mb": mb,
            }
        )
        out["mutations_s"][name] = dt
    names0 = _layer0(names)
    for key, fn in (("factor_average_rel_error", lucid.crossover_average), ("dare_rel_error", lucid.crossover_dare)):
        pop = population(len(parents) + 1)
        fn(pop, torch.tensor([[0, 1]]), torch.tensor([len(parents)]))
        num = den = 0.0
        for n in names0:
            child = pop.weight_up[n][-1] @ pop.weight_down[n][-1].T
            avg = sum(p.modules[n].delta() for p in parents) / len(parents)
            num += float((child.double() - avg.double()).norm()) ** 2
            den += float(avg.double().norm()) ** 2
        out[key] = (num / den) ** 0.5
    return out


def evolve_cli_seconds(d: Path) -> float:
    """Wall time of ``populora evolve svd`` on the saved parents in a new process: Python start-up,
    imports, plugin discovery, reading, the operator, writing and lineage (what a scheduler pays)."""
    cmd = [
        sys.executable,
        "-m",
        "populora_core.cli",
        "evolve",
        "svd",
        "--parent",
        str(d / "p0"),
        "--parent",
        str(d / "p1"),
    ]
    t0 = time.perf_counter()
    res = subprocess.run([*cmd, "--out", str(d / "cli_child"), "--seed", "0"], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"populora evolve failed: {res.stderr.strip()[-500:]}")
    return dt


# --- main ---------------------------------------------------------------------------------------


def _warm_up() -> None:
    """Load (or compile, once per install) the numba merge kernel outside the timings."""
    import torch
    from populora_lora_ops import OPERATORS, ops
    from populora_lora_ops.synthetic import trained_like

    ps = [trained_like({"m": (64, 64)}, 4, 8.0, s) for s in (1, 2)]
    for name in ("dare", "ties", "della"):
        ops.delta_merge(ps, OPERATORS[name][1](), torch.Generator().manual_seed(0))


def bench_rank(
    rank: int,
    layers: int,
    shapes: dict[str, tuple[int, int]],
    ops_to_run: list[str],
    workdir: Path,
    do_peft: bool,
    rows: list[dict[str, Any]],
    peft_modules: list[str] | None,
) -> dict[str, Any]:
    import torch
    from populora_lora_ops import OPERATORS, SvdCrossoverParams, ops
    from populora_lora_ops.synthetic import module_names, trained_like

    from populora_core.services.adapters import load_lora, save_lora

    named = module_names(layers, shapes)
    alpha = 2.0 * rank
    parents = [trained_like(named, rank, alpha, seed) for seed in (1, 2)]
    result: dict[str, Any] = {}
    for name in ops_to_run:
        fn_name, model, (_, most) = OPERATORS[name]  # (fewest, most) parents
        ps = parents[:1] if most == 1 else parents
        fn = getattr(ops, fn_name)
        child, dt, mb = _timed(lambda fn=fn, ps=ps, model=model: fn(ps, model(), torch.Generator().manual_seed(0)))
        rows.append({"operator": name, "rank": rank, "seconds": dt, "cpu_s": _CPU["last"], "peak_mb": mb})
        result[name] = (dt, mb, _CPU["last"])
        del child

    # svd crossover end to end from PEFT dirs (read + operate + write)
    d = workdir / f"r{rank}"
    for i, p in enumerate(parents):
        save_lora(p, d / f"p{i}")

    runs: list[dict[str, float]] = []  # each run's phases (a new child directory each: versions are immutable)

    def io_svd() -> None:
        t0 = time.perf_counter()
        ps = [load_lora(d / "p0"), load_lora(d / "p1")]  # safetensors memory-maps: no copy until touched
        t1 = time.perf_counter()
        child = ops.svd_crossover(ps, OPERATORS["svd"][1](), torch.Generator())
        t2 = time.perf_counter()
        save_lora(child, d / f"child{len(runs)}")
        runs.append({"read": t1 - t0, "operate": t2 - t1, "write": time.perf_counter() - t2})

    _, dt_io, mb_io = _timed(io_svd)
    phases = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    rows.append(
        {"operator": "svd (read+op+write)", "rank": rank, "seconds": dt_io, "cpu_s": _CPU["last"], "peak_mb": mb_io}
    )
    result.update(
        svd_io_s=dt_io, svd_read_s=phases["read"], svd_operate_in_io_s=phases["operate"], svd_write_s=phases["write"]
    )
    result["svd_evolve_cli_s"] = evolve_cli_seconds(d)
    rows.append(
        {
            "operator": "populora evolve svd (new process)",
            "rank": rank,
            "seconds": result["svd_evolve_cli_s"],
            "peak_mb": float("nan"),
        }
    )
    shutil.rmtree(d, ignore_errors=True)

    if not do_peft:
        return result
    # PEFT's svd merge and both errors against a dense fp32 reference, on layer 0 (or some of its modules)
    names0 = [n for n in _layer0(list(named)) if peft_modules is None or n.rsplit(".", 1)[-1] in peft_modules]
    weights = [0.5, 0.5]
    sub = [p.with_modules({n: p.modules[n] for n in names0}) for p in parents]
    svd_params = SvdCrossoverParams(weights=weights)  # OPERATORS["svd"][1]
    _, ours_sub_s, _ = _timed(lambda: ops.svd_crossover(sub, svd_params, torch.Generator()))
    ours = ops.svd_crossover(sub, svd_params, torch.Generator())
    peft_deltas, peft_dt = peft_svd_one_layer(parents, names0, named, weights)
    err_num = err_sum_num = ref_den = sum_den = peft_num = peft_sum_num = favg_num = 0.0
    for n in names0:
        w = cast(torch.Tensor, sum(wi * p.modules[n].delta() for wi, p in zip(weights, parents)))  # two parents
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        ref = (u[:, :rank] * s[:rank]) @ vh[:rank]
        mine = ours.modules[n].delta()
        err_num += float((mine.double() - ref.double()).norm()) ** 2
        err_sum_num += float((mine.double() - w.double()).norm()) ** 2
        ref_den += float(ref.double().norm()) ** 2
        sum_den += float(w.double().norm()) ** 2
        peft_num += float((peft_deltas[n].double() - ref.double()).norm()) ** 2
        peft_sum_num += float((peft_deltas[n].double() - w.double()).norm()) ** 2
        # the factor-averaging pitfall ((B1+B2)/2 (A1+A2)/2), reimplemented here for reference
        f1, f2 = parents[0].modules[n], parents[1].modules[n]
        favg = f1.scale * ((f1.B + f2.B) / 2) @ ((f1.A + f2.A) / 2)
        favg_num += float((favg.double() - w.double()).norm()) ** 2
    full_layer = peft_modules is None
    result.update(
        {
            "peft_scope": "layer 0, all modules" if full_layer else f"layer 0, {', '.join(peft_modules or [])}",
            "svd_rel_error": (err_num / ref_den) ** 0.5,
            "svd_rel_error_vs_sum": (err_sum_num / sum_den) ** 0.5,
            "factor_average_rel_error_vs_sum": (favg_num / sum_den) ** 0.5,
            "peft_rel_error": (peft_num / ref_den) ** 0.5,
            "peft_rel_error_vs_sum": (peft_sum_num / sum_den) ** 0.5,
            "peft_scope_s": peft_dt,
            "svd_scope_s": ours_sub_s,
            "peft_s": peft_dt * layers if full_layer else None,
            "speedup_vs_peft": (peft_dt * layers / result["svd"][0]) if full_layer else peft_dt / ours_sub_s,
        }
    )
    rows.append(
        {
            "operator": f"svd crossover on {result['peft_scope']}",
            "rank": rank,
            "seconds": ours_sub_s,
            "peak_mb": float("nan"),
        }
    )
    rows.append(
        {
            "operator": f"PEFT svd merge on {result['peft_scope']}",
            "rank": rank,
            "seconds": peft_dt,
            "peak_mb": float("nan"),
        }
    )
    if full_layer:
        rows.append(
            {
                "operator": f"PEFT svd merge (1 layer measured x {layers})",
                "rank": rank,
                "seconds": peft_dt * layers,
                "peak_mb": float("nan"),
            }
        )
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 layers of q,k,v,o at rank 16 (under a minute)")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="1 layer of k,v at rank 16, PEFT on k_proj, lucidrains only if already installed: checks it runs",
    )
    ap.add_argument("--ranks", type=int, nargs="+", default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--no-peft", action="store_true")
    ap.add_argument(
        "--peft-ranks",
        type=int,
        nargs="+",
        default=[16],
        help="ranks at which PEFT's svd merge is run (each costs minutes at 7B shapes)",
    )
    ap.add_argument("--lucid-target", default="/tmp/lucid", help="throwaway pip --target dir for `populora`")
    ap.add_argument("--no-lucid", action="store_true", help="skip the comparison with lucidrains' populora")
    ap.add_argument("--operators", nargs="+", default=None)
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"each timing is the median of this many runs (a call over {REPEAT_BELOW_S:g} s runs once); "
        "default 3, 1 with --quick or --smoke",
    )
    args = ap.parse_args(argv)

    import torch
    from populora_lora_ops import OPERATORS
    from populora_lora_ops.synthetic import QWEN25_7B_SHAPES

    torch.set_num_threads(args.threads)
    shapes = dict(QWEN25_7B_SHAPES)
    if args.smoke:
        shapes = {k: v for k, v in shapes.items() if k in ("self_attn.k_proj", "self_attn.v_proj")}
    elif args.quick:
        shapes = {k: v for k, v in shapes.items() if k.startswith("self_attn")}
    small = args.quick or args.smoke
    _REPEATS["n"] = args.repeats or (1 if small else 3)
    layers = args.layers or (1 if args.smoke else 2 if args.quick else 28)
    ranks = args.ranks or ([16] if small else [16, 64])
    ops_to_run = args.operators or [n for n in OPERATORS if n != "delta_merge"]  # delta_merge == della
    if args.no_lucid:
        lucid_ok, lucid_info = False, "--no-lucid"
    else:
        lucid_ok, lucid_info = try_lucidrains(args.lucid_target, install=not args.smoke)
    if not lucid_ok:
        print(f"lucidrains comparison skipped: {lucid_info}", file=sys.stderr)
    _warm_up()

    rows: list[dict[str, Any]] = []
    per_rank: dict[int, dict[str, Any]] = {}
    lucid: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ops-") as tmp:
        for rank in ranks:
            per_rank[rank] = bench_rank(
                rank,
                layers,
                shapes,
                ops_to_run,
                Path(tmp),
                not args.no_peft and rank in args.peft_ranks,
                rows,
                ["k_proj"] if args.smoke else ["k_proj", "v_proj"] if args.quick else None,
            )
    if lucid_ok:  # last: its import cannot disturb our timings
        from populora_lora_ops.synthetic import module_names, trained_like

        rank = 16 if 16 in ranks else ranks[0]
        named = module_names(layers, shapes)
        lucid = bench_lucidrains(
            lucid_info, [trained_like(named, rank, 2.0 * rank, seed) for seed in (1, 2)], named, rows
        )

    print(
        f"# Qwen2.5-7B shapes: {layers} layers x {', '.join(k.split('.')[1] for k in shapes)}; "
        f"{args.threads} thread(s); torch {torch.__version__}; {platform.processor() or platform.machine()}"
    )
    print(f"{'operator':44s} {'rank':>4s} {'s/child':>9s} {'cpu s':>9s} {'peak MB':>9s}")
    for row in rows:
        print(
            f"{row['operator']:44s} {row['rank']:4d} {row['seconds']:9.3f} {row.get('cpu_s', float('nan')):9.3f} "
            f"{row['peak_mb']:9.1f}"
        )
    head = per_rank.get(16) or per_rank[ranks[0]]
    mutations = [n for n in ("svd_structured", "layer_gaussian", "component_mask", "gaussian", "neftune") if n in head]
    for rank, res in per_rank.items():
        if "peft_scope" not in res:
            continue
        if res.get("peft_s") is not None:
            print(
                f"# rank {rank}: PEFT add_weighted_adapter(svd) measured on ONE layer "
                f"({res['peft_scope_s']:.1f} s) and extrapolated x{layers} = {res['peft_s']:.0f} s"
            )
        else:
            print(
                f"# rank {rank}: PEFT add_weighted_adapter(svd) measured on {res['peft_scope']} only: "
                f"{res['peft_scope_s']:.2f} s vs ours {res['svd_scope_s']:.4f} s on the same modules"
            )
        print(
            f"# rank {rank}: rel. error on {res['peft_scope']} vs dense truncated SVD: "
            f"ours {res['svd_rel_error']:.2e}, PEFT {res['peft_rel_error']:.2e}; vs the full weighted sum: "
            f"ours {res['svd_rel_error_vs_sum']:.3f}, PEFT {res['peft_rel_error_vs_sum']:.3f}, "
            f"factor averaging {res['factor_average_rel_error_vs_sum']:.3f}"
        )
    if lucid:
        lucid_note = (
            f"lucidrains populora (from {lucid_info}): mutations {min(lucid['mutations_s'].values()):.2f}-"
            f"{max(lucid['mutations_s'].values()):.2f} s per child; on layer 0 its factor-averaging "
            f"crossover lands {lucid['factor_average_rel_error']:.0%} and its factor-DARE crossover "
            f"{lucid['dare_rel_error']:.0%} (relative) away from the true average of the parents' delta W"
        )
    else:
        lucid_note = f"lucidrains populora: not compared ({lucid_info})"
    print(f"# {lucid_note}")
    print(
        f"# svd child in one process: read {head['svd_read_s']:.3f} + operate {head['svd_operate_in_io_s']:.3f} + "
        f"write {head['svd_write_s']:.3f} = {head['svd_io_s']:.3f} s; `populora evolve svd` in a new process "
        f"(Python start-up, imports, lineage) {head['svd_evolve_cli_s']:.2f} s"
    )

    vs_lucid: dict[str, dict[str, Any]] = {}
    for ours, theirs in LUCID_COUNTERPARTS.items():
        if ours in head and theirs in lucid.get("mutations_s", {}):
            t_ours, t_theirs = head[ours][0], lucid["mutations_s"][theirs]
            vs_lucid[ours] = {"s": t_ours, "lucidrains": theirs, "lucidrains_s": t_theirs, "ratio": t_ours / t_theirs}
    vs_lucid_s = [v["lucidrains_s"] for v in vs_lucid.values()]
    for ours, v in vs_lucid.items():
        print(f"# {ours} {v['s']:.3f} s vs lucidrains {v['lucidrains']} {v['lucidrains_s']:.3f} s (x{v['ratio']:.2f})")

    def first(key: str) -> Any:
        v = head.get(key)
        return v[0] if isinstance(v, tuple) else v

    summary = {
        "benchmark": "operators",
        "quick": args.quick,
        "smoke": args.smoke,
        "layers": layers,
        "modules": [k.split(".")[1] for k in shapes],
        "threads": args.threads,
        "repeats": _REPEATS["n"],
        "rank": 16 if 16 in per_rank else ranks[0],
        "svd_crossover_s": first("svd"),
        "svd_crossover_io_s": head["svd_io_s"],
        "svd_child_total_s": head["svd_io_s"],
        "svd_read_s": head["svd_read_s"],
        "svd_operate_in_io_s": head["svd_operate_in_io_s"],
        "svd_write_s": head["svd_write_s"],
        "svd_evolve_cli_s": head["svd_evolve_cli_s"],
        "load_average_1min": os.getloadavg()[0],
        "peft_svd_s": head.get("peft_s"),
        "peft_scope": head.get("peft_scope"),
        "peft_scope_s": head.get("peft_scope_s"),
        "svd_scope_s": head.get("svd_scope_s"),
        "peft_svd_extrapolated": (f"1 layer measured x {layers}" if head.get("peft_s") is not None else None),
        "speedup_vs_peft": head.get("speedup_vs_peft"),
        "svd_rel_error": head.get("svd_rel_error"),
        "peft_rel_error": head.get("peft_rel_error"),
        "svd_rel_error_vs_sum": head.get("svd_rel_error_vs_sum"),
        "peft_rel_error_vs_sum": head.get("peft_rel_error_vs_sum"),
        "factor_average_rel_error_vs_sum": head.get("factor_average_rel_error_vs_sum"),
        "max_mutation_s": max((first(n) for n in mutations), default=None),
        "max_mutation_cpu_s": max((head[n][2] for n in mutations), default=None),
        "svd_crossover_cpu_s": head["svd"][2] if "svd" in head else None,
        "della_cpu_s": head["della"][2] if "della" in head else None,
        "dare_cpu_s": head["dare"][2] if "dare" in head else None,
        "ties_cpu_s": head["ties"][2] if "ties" in head else None,
        "della_s": first("della"),
        "della_peak_mb": head["della"][1] if "della" in head else None,
        "dare_s": first("dare"),
        "dare_peak_mb": head["dare"][1] if "dare" in head else None,
        "ties_s": first("ties"),
        "ties_peak_mb": head["ties"][1] if "ties" in head else None,
        "max_fast_crossover_s": max(
            (first(n) for n in ("svd", "svd_subspace", "layerwise", "clone", "extrapolate", "xes") if n in head),
            default=None,
        ),
        "lucidrains_mutation_s": max(lucid["mutations_s"].values()) if lucid else None,
        "lucidrains_max_mutation_s": max(vs_lucid_s) if vs_lucid_s else None,
        "mutations_vs_lucidrains": vs_lucid or None,
        "every_mutation_at_or_below_lucidrains": all(v["ratio"] <= 1.0 for v in vs_lucid.values())
        if vs_lucid
        else None,
        "lucidrains_mutations_s": lucid.get("mutations_s"),
        "lucidrains_factor_average_rel_error": lucid.get("factor_average_rel_error"),
        "lucidrains_dare_rel_error": lucid.get("dare_rel_error"),
        "lucidrains_note": lucid_note,
        "operators": {n: {"s": v[0], "peak_mb": v[1], "cpu_s": v[2]} for n, v in head.items() if isinstance(v, tuple)},
        "per_rank": {
            str(r): {k: (list(v) if isinstance(v, tuple) else v) for k, v in res.items()} for r, res in per_rank.items()
        },
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
