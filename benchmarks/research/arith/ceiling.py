"""The arithmetic world's supervised ceiling: how far gold answers move ``arith_nano``'s held-out accuracy.

    python -m benchmarks.research.arith.ceiling                      # 600 steps x 64 problems, all 640 held out
    python -m benchmarks.research.arith.ceiling --smoke              # a few steps, a few problems (CI)

Why: self-play can only teach what the base can learn. Before any reinforcement learning this measures the best a
student of the world's recipes could do with a perfect teacher: a fresh LoRA adapter of ``recipes/arith.yaml``'s
shape (its ``lora`` section) trained on the gold answers of ``--steps`` x ``--batch`` problems drawn fresh from
every level (never a held-out or probe problem), cross-entropy on the answer as the base was trained, AdamW at
``--lr``. Then per-sample accuracy (k = 8 answers at temperature 1, the students' sampling) on the held-out set,
base against trained, per level and overall, each problem paired with itself, with a 95 % cluster-bootstrap interval
(problems resampled within their level) and the design's minimum detectable effect (80 % power). The gate of the
world (issue 50): overall held-out accuracy rises by at least 10 points. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from populora_arith import HELDOUT_FILE, MODEL_DIR, PROBE_FILE, world
from populora_arith.heldout import read_problems

from populora_core.services.statistics import cluster_bootstrap, cluster_mde

from ..transfer import cpu_name
from .make_model import Stream, completion_loss, sample_accuracy

REPO = Path(__file__).resolve().parents[3]


def lora_section(recipe: Path) -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load(recipe.read_text())["lora"])


def train_gold(model: Any, tokenizer: Any, stream: Stream, steps: int, batch: int, lr: float) -> list[float]:
    """AdamW on gold answers of fresh problems (every level, one kind of batch: questions); the losses."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        loss = completion_loss(model, tokenizer, [stream.solution() for _ in range(batch)], masked=True)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.research.arith.ceiling", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--k", type=int, default=8, help="answers per held-out problem")
    ap.add_argument("--limit", type=int, default=None, help="only the first N held-out problems of each level")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--full", action="store_true", help="train every weight as the base was (the world's ceiling), no LoRA"
    )
    ap.add_argument("--levels", default="1,2,3,4,5,6", help="levels of the training problems (comma list)")
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes" / "arith.yaml", help="whose lora section")
    ap.add_argument("--model", type=Path, default=MODEL_DIR, help="the base (a make_model snapshot); the shipped one")
    ap.add_argument("--smoke", action="store_true", help="5 steps, 4 problems a level, k = 2: that it runs (CI)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.limit, args.k = 5, 4, 2

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from populora_core.services.runtime import set_torch_threads

    set_torch_threads(1)
    t0 = time.time()
    heldout = read_problems(HELDOUT_FILE)
    if args.limit:
        heldout = [p for lv in world.LEVELS for p in [q for q in heldout if world.level(*q) == lv][: args.limit]]
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)  # one tokenizer for every snapshot (make_model's)
    base = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    before = sample_accuracy(base, tokenizer, heldout, args.k, args.seed)
    lora = lora_section(args.recipe)
    torch.manual_seed(args.seed)
    config = LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], target_modules=list(lora["target_modules"]))
    model = base if args.full else get_peft_model(base, config)
    excluded = set(read_problems(HELDOUT_FILE)) | set(read_problems(PROBE_FILE))
    trained_levels = [int(x) for x in args.levels.split(",")]
    stream = Stream(args.seed, excluded, dict.fromkeys(trained_levels, 1.0), 0.0)
    t_train = time.time()
    losses = train_gold(model, tokenizer, stream, args.steps, args.batch, args.lr)
    train_s = time.time() - t_train
    after = sample_accuracy(model, tokenizer, heldout, args.k, args.seed)
    levels = [f"L{world.level(*p)}" for p in heldout]
    rows: list[dict[str, Any]] = []
    for label in ["all", *sorted(set(levels))]:
        pairs = [(b, a) for b, a, lv in zip(before, after, levels, strict=True) if label in ("all", lv)]
        clusters = [[a - b] for b, a in pairs]
        low, high = cluster_bootstrap(clusters, strata=levels if label == "all" else None)
        rows.append({
            "level": label, "problems": len(pairs), "base": statistics.fmean(b for b, _ in pairs),
            "trained": statistics.fmean(a for _, a in pairs), "gain": statistics.fmean(a - b for b, a in pairs),
            "low": low, "high": high, "mde": cluster_mde(clusters),
        })  # fmt: skip
    what = "every weight" if args.full else f"a rank-{lora['rank']} LoRA"
    lines = [
        f"Supervised ceiling of arith_nano: {what} trained on the gold answers of "
        f"{args.steps * args.batch:,} fresh problems ({args.steps} steps x {args.batch}, levels {args.levels}, "
        f"lr {args.lr}) "
        f"in {train_s:.0f} s on "
        f"{cpu_name()}; loss {statistics.fmean(losses[:10]):.3f} -> {statistics.fmean(losses[-10:]):.3f}. "
        f"Held-out per-sample accuracy (k = {args.k}, temperature 1), in points:",
        "",
        "| level | problems | base | trained | gain [95 % CI] | detectable (80 % power) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        mde = "-" if r["mde"] is None else f"{100 * r['mde']:.1f}"
        lines.append(
            f"| {r['level']} | {r['problems']} | {100 * r['base']:.1f} | {100 * r['trained']:.1f} | "
            f"{100 * r['gain']:+.1f} [{100 * r['low']:+.1f}, {100 * r['high']:+.1f}] | {mde} |"
        )
    print("\n".join(lines))
    result = {
        "benchmark": "arith_ceiling",
        "cpu": cpu_name(),
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "levels_trained": trained_levels,
        "trained": "full" if args.full else f"lora rank {lora['rank']}",
        "model": str(args.model),
        "k": args.k,
        "train_seconds": round(train_s, 1),
        "seconds": round(time.time() - t0, 1),
        "levels": rows,
        "gain": rows[0]["gain"],
        "gate_10_points": rows[0]["gain"] >= 0.10 and rows[0]["low"] > 0,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
