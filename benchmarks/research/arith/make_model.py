"""Make the arithmetic world's base model (``arith_nano``) from scratch: held-out and probe sets, tokenizer,
pretraining on a seeded stream of problems, and a per-level solve-rate curve along the way.

    python -m benchmarks.research.arith.make_model --out DIR --steps N [--curve-every K]

Writes ``DIR/model/`` (LlamaForCausalLM safetensors + a one-character-per-token tokenizer), ``DIR/heldout.jsonl``
(the held-out evaluation set), ``DIR/probe.jsonl`` (the run's probe set) and ``DIR/make_model.json`` (settings,
steps, timings, the curve: per-sample solve rate per level at temperature 1 every ``--curve-every`` steps).

Why these choices: the learning rate is constant after warm-up, so the model after step M of a long run is the
model ``--steps M`` makes (bit for bit on one torch build): the curve picks the step count, the shipped model is
made with it. The student's examples cover levels 1 to ``--solver-levels`` only, so the top levels stay unsolved
(length generalisation fails in small transformers) and a curriculum has room above the base. The proposer's
examples cover every level: given references of one level it writes a question of a neighbouring one, so what a
teacher is shown and what it learns moves its difficulty.
Every problem the stream draws is checked against the held-out and probe sets, which are drawn first and are
disjoint by construction (checked again when written).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from populora_arith import world
from populora_arith.heldout import overlap

from ..nano.make_model import SPECIALS, check_round_trip, log, tiny_llama

#: Held-out problems per level; level 1 has only 100 problems in all, so it keeps 40 of them out of training.
HELDOUT_PER_LEVEL = {1: 40, **{lv: 120 for lv in world.LEVELS[1:]}}
PROBE_PER_LEVEL = 20
#: Positions the base handles: a proposer prompt of three 6-digit questions and its answer fit in 64
CONTEXT = 128


@dataclass(frozen=True)
class Example:
    prompt: str
    completion: str


def held_out_sets(seed: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The held-out set and the probe set: disjoint, every level, drawn from ``seed`` alone."""
    rng = random.Random(seed)
    heldout: list[tuple[int, int]] = []
    probe: list[tuple[int, int]] = []
    for lv in world.LEVELS:
        taken: set[tuple[int, int]] = set()
        for target, count in ((heldout, HELDOUT_PER_LEVEL[lv]), (probe, PROBE_PER_LEVEL)):
            picked: list[tuple[int, int]] = []
            while len(picked) < count:
                p = world.draw(lv, rng)
                if p not in taken:
                    taken.add(p)
                    picked.append(p)
            target.extend(picked)
    shared = overlap(heldout, {"the probe set": probe})
    if shared:
        raise RuntimeError(f"the held-out set is not held out: it shares {shared}")
    return heldout, probe


def tokenizer_for() -> Any:
    """One token per character of :data:`world.ALPHABET`, plus ``<pad> <s> </s>``; decoding joins them."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *world.ALPHABET])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", padding_side="left"
    )


class Stream:
    """Training examples drawn on the fly from a seed, never a held-out or probe problem."""

    def __init__(
        self, seed: int, excluded: set[tuple[int, int]], solver_weights: dict[int, float], propose_share: float
    ) -> None:
        self.rng = random.Random(seed)
        self.excluded = excluded
        self.solver_levels = list(solver_weights)
        self.solver_weights = list(solver_weights.values())
        self.propose_share = propose_share
        self.drawn = 0

    def problem(self, lv: int) -> tuple[int, int]:
        while True:
            p = world.draw(lv, self.rng)
            if p not in self.excluded:
                self.drawn += 1
                return p

    def batch(self, size: int) -> list[Example]:
        """One kind per batch: proposer prompts are about four times a question's length, and a mixed batch pads
        every question to the longest prompt. A proposer batch holds half as many examples."""
        if self.rng.random() < self.propose_share:
            return [self.proposal() for _ in range(size // 2)]
        return [self.solution() for _ in range(size)]

    def proposal(self) -> Example:
        rng = self.rng
        ref_level = rng.choice(world.LEVELS)
        refs = [self.problem(ref_level) for _ in range(rng.randint(1, 3))]
        new_level = min(world.MAX_DIGITS, max(1, ref_level + rng.choice((-1, 0, 0, 1))))
        a, b = self.problem(new_level)
        return Example(world.proposer_prompt(refs), world.question(a, b) + world.PROPOSAL_STOP)

    def solution(self) -> Example:
        rng = self.rng
        lv = rng.choices(self.solver_levels, self.solver_weights)[0]
        a, b = self.problem(lv)
        return Example(world.solver_prompt(a, b), world.answer(a, b))


def sample_accuracy(
    model: Any, tokenizer: Any, problems: list[tuple[int, int]], samples: int, seed: int
) -> list[float]:
    """Per problem, the share of ``samples`` answers at temperature 1 (how the run's students sample) that are right."""
    import torch

    torch.manual_seed(seed)
    out: list[float] = []
    for start in range(0, len(problems), 256):
        chunk = problems[start : start + 256]
        enc = tokenizer([world.solver_prompt(a, b) for a, b in chunk], return_tensors="pt", padding=True)
        with torch.no_grad():
            generated = model.generate(
                **enc, do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=world.MAX_DIGITS + 2,
                num_return_sequences=samples, pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
        texts = tokenizer.batch_decode(generated[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        for i, (a, b) in enumerate(chunk):
            answers = texts[i * samples : (i + 1) * samples]
            out.append(sum(text.strip() == world.answer(a, b) for text in answers) / samples)
    return out


def solve_rates(
    model: Any, tokenizer: Any, problems: list[tuple[int, int]], samples: int, seed: int
) -> dict[int, float]:
    """Per-sample solve rate per level."""
    right: dict[int, list[float]] = {}
    for (a, b), acc in zip(problems, sample_accuracy(model, tokenizer, problems, samples, seed), strict=True):
        right.setdefault(world.level(a, b), []).append(acc)
    return {lv: round(statistics.fmean(v), 4) for lv, v in sorted(right.items())}


def completion_loss(model: Any, tokenizer: Any, examples: list[Example], *, masked: bool) -> Any:
    """Mean cross-entropy over the completions (and EOS) of a right-padded batch, prompts unweighted.

    ``masked``: pass an attention mask. The base is trained without one (pads sit after every weighted token, so
    causal attention never lets them in) and its build stays bit for bit what it was; an adapter trained on top
    (the ceiling) masks, as a run's trainer does.
    """
    import torch

    vocab, pad, eos = tokenizer.get_vocab(), tokenizer.pad_token_id, tokenizer.eos_token_id
    rows = [([vocab[c] for c in ex.prompt], [vocab[c] for c in ex.completion] + [eos]) for ex in examples]
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attend = torch.zeros((len(rows), width), dtype=torch.long)
    weight = torch.zeros((len(rows), width))
    for r, (p, c) in enumerate(rows):
        ids[r, : len(p) + len(c)] = torch.tensor(p + c)
        attend[r, : len(p) + len(c)] = 1
        weight[r, len(p) : len(p) + len(c)] = 1.0
    logits = model(input_ids=ids, **({"attention_mask": attend} if masked else {})).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="none"
    ).view(len(rows), width - 1)
    w = weight[:, 1:]
    return (nll * w).sum() / w.sum()


def train(
    model: Any,
    tokenizer: Any,
    stream: Stream,
    *,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    curve_every: int,
    curve_problems: list[tuple[int, int]],
    snapshots: Path | None,
) -> dict[str, Any]:
    """AdamW with linear warm-up then a constant rate; loss on the completion only."""
    import torch

    torch.manual_seed(seed + 2)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup, start, curve, losses = 50, time.time(), [], []
    for step in range(1, steps + 1):
        examples = stream.batch(batch)
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, step / warmup)
        loss = completion_loss(model, tokenizer, examples, masked=False)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0:
            log(f"step {step} loss {sum(losses[-100:]) / 100:.4f} ({time.time() - start:.0f}s)")
        if curve_every and step % curve_every == 0:
            model.eval()
            rates = solve_rates(model, tokenizer, curve_problems, 4, seed + step)
            model.train()
            curve.append({"step": step, "seconds": round(time.time() - start, 1), "solve_rate": rates})
            log(f"step {step}: per-sample solve rate by level {rates}")
            if snapshots is not None:
                model.save_pretrained(snapshots / f"step{step}")
    model.eval()
    return {
        "steps": steps,
        "train_seconds": round(time.time() - start, 1),
        "final_loss": round(sum(losses[-100:]) / len(losses[-100:]), 4),
        "curve": curve,
        "problems_drawn": stream.drawn,
    }


def _records(problems: list[tuple[int, int]]) -> str:
    return "".join(
        json.dumps({"task_type": "arith", "question": world.question(a, b), "a": a, "b": b}) + "\n" for a, b in problems
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.research.arith.make_model", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--out", type=Path, help="where to write (required but with --smoke)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout-seed", type=int, default=20261204)
    ap.add_argument("--steps", type=int, default=None, help="training steps (required but with --smoke)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--hidden", type=int, default=160)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=5)
    ap.add_argument("--solver-weights", default="1:3:3:1", help="relative share of student examples per level 1..")
    ap.add_argument("--propose-share", type=float, default=0.2, help="share of batches that are proposer examples")
    ap.add_argument("--curve-every", type=int, default=0, help="measure per-level solve rates every K steps")
    ap.add_argument("--snapshots", action="store_true", help="save the model at every curve point")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="20 steps and a curve point into a temporary folder (CI)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.curve_every = 20, 20
        if args.out is None:
            with tempfile.TemporaryDirectory(prefix="arith-make-model-") as tmp:
                args.out = Path(tmp)
                return build(args)
    if args.out is None or args.steps is None:
        ap.error("--out and --steps are required (or --smoke)")
    return build(args)


def build(args: argparse.Namespace) -> dict[str, Any]:
    """Everything ``main`` describes, for parsed arguments."""

    import torch

    from populora_core.services.runtime import set_torch_threads

    set_torch_threads(args.threads)
    t0 = time.time()
    heldout, probe = held_out_sets(args.heldout_seed)
    weights = {i + 1: float(w) for i, w in enumerate(args.solver_weights.split(":"))}
    stream = Stream(args.seed, set(heldout) | set(probe), weights, args.propose_share)
    tokenizer = tokenizer_for()
    torch.manual_seed(args.seed)
    model = tiny_llama(tokenizer, hidden=args.hidden, layers=args.layers, heads=args.heads, context=CONTEXT)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f}M parameters, vocab {len(tokenizer)}")
    curve_rng = random.Random(args.heldout_seed + 1)
    curve_problems = [
        p for lv in world.LEVELS for p in curve_rng.sample([q for q in heldout if world.level(*q) == lv], 40)
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    snapshots = args.out / "snapshots" if args.snapshots else None
    stats = train(
        model,
        tokenizer,
        stream,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        seed=args.seed,
        curve_every=args.curve_every,
        curve_problems=curve_problems,
        snapshots=snapshots,
    )
    model_dir = args.out / "model"
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(model_dir)
    tokenizer.model_max_length = CONTEXT
    tokenizer.save_pretrained(model_dir)
    check_round_trip(model_dir, [world.proposer_prompt(heldout[:3]), world.solver_prompt(*heldout[0])], tokenizer)
    (args.out / "heldout.jsonl").write_text(_records(heldout))
    (args.out / "probe.jsonl").write_text(_records(probe))
    report = {
        "seed": args.seed,
        "heldout_seed": args.heldout_seed,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "parameters": n_params,
        "model_bytes": sum(f.stat().st_size for f in model_dir.iterdir()),
        **stats,
        "total_seconds": round(time.time() - t0, 1),
        "threads": args.threads,
    }
    (args.out / "make_model.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"done in {report['total_seconds']}s, final loss {report['final_loss']}")
    print(json.dumps({k: v for k, v in report.items() if k != "settings"}))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
