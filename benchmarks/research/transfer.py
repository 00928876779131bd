"""Transfer: does a student trained on N distinct problems get better on problems it never saw?

    python -m benchmarks.research.transfer                  # recipes/nano.yaml; N = 18 / 72 / 288 / 1152, 64 steps each
    python -m benchmarks.research.transfer --quick          # 2 steps, tiny pools and held-out set (CI)
    python -m benchmarks.research.transfer 'tasks=[{name: induction, params: {style: compact}}]' \\
        --samples 12 --sizes 288
        # recipe overrides come first: one task type alone, 12 answers a problem, one arm

Why: self-play can only help a student beyond the problems it is handed if what it learns on some problems carries
over to others. This benchmark removes the teachers and measures that directly. One arm per pool size N: a student
of the recipe (its engine, trainer, tasks, sampling and update sizes) trained on N distinct problems drawn from nano's
corpus generator (`benchmarks.research.nano.corpus`, N split evenly over the recipe's task types, the shipped probe's
programs excluded), every arm at the same compute: ``--steps`` updates of ``rollout.proposals_per_teacher`` problems per
task type x ``--samples`` answers each (the pool is cycled, each problem equally often). Then
per-sample accuracy (``--k`` answers at the recipe's temperature) on ``--heldout`` problems per task type whose
programs are in no pool, against the same for the base (the adapters' step 0), with a 95 % bootstrap interval over
held-out problems as units (resampled within task types) and the minimum detectable effect of that design (80 %
power, two-sided 5 %). The accuracy on the smallest pool's problems (every arm trained on them) shows what each arm
learned where it trained. Pool sizes must be multiples of the number of task types; smaller pools are prefixes of
larger ones; the drawn programs are shuffled before the split. ``--max-program-steps`` keeps programs of at most
that many steps.

``--supervised``: the ceiling of the same design. Each arm trains its LoRA adapter on the gold answers of the same
problems in the same order (one answer per problem, cross-entropy on the answer's tokens as nano was pretrained,
AdamW at ``--supervised-lr``), so every problem teaches, whatever the student can already solve. If this arm
moves held-out problems no more than reinforcement learning does, the base does not transfer at this compute,
however dense the signal. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TASK_TYPES = ("deduction", "abduction", "induction")


def cpu_name() -> str:
    """`lscpu`'s model name (from /proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def draw_problems(
    executor: Any,
    types: Sequence[str],
    per_type: Sequence[int],
    seed: int,
    exclude: set[str],
    max_steps: int | None,
) -> tuple[list[dict[str, list[Any]]], dict[str, int]]:
    """Problem sets with ``per_type[i]`` problems of each of ``types`` each, no program shared by two problems
    (across sets too), none in ``exclude``; programs of at most ``max_steps`` steps when given. Also each
    program's number of steps."""
    from populora_azr.problems import CodeProblem as Problem

    import benchmarks.research.nano.corpus as corpus

    need = 3 * sum(per_type)
    rng = random.Random(seed)
    programs: list[Any] = []
    seen = set(exclude)
    while len(programs) < need:
        batch = corpus.generate_programs(min(need - len(programs) + 50, 600), rng, executor, exclude=seen, chunk=300)
        seen |= {p.code for p in batch}
        kept = [p for p in batch if max_steps is None or p.steps <= max_steps]
        if not kept:
            raise SystemExit(
                f"--max-program-steps {max_steps}: the generator has only {len(programs)} distinct valid programs "
                f"that short, {need} needed; draw fewer (--sizes, --heldout) or allow longer programs"
            )
        programs += kept
    # shuffled before the split: the generator runs out of distinct short programs as it draws, so its first
    # programs are shorter than its last; unshuffled, held-out and small pools would be easier than large ones
    rng.shuffle(programs)
    programs = programs[:need]
    sets, start = [], 0
    for count in per_type:
        records = corpus.probe_records(programs[start : start + 3 * count], count, random.Random(seed + start + 1))
        start += 3 * count
        sets.append(
            {t: [Problem(**r, valid=True, proposer="transfer") for r in records if r["task_type"] == t] for t in types}
        )
    return sets, {p.code: p.steps for p in programs}


def breakdown(acc: dict[str, list[float]], problems: dict[str, list[Any]], steps_of: dict[str, int]) -> list[dict]:
    """Per task type and program length: how many problems, their mean per-sample accuracy, the share solved
    at least once (pass@k: what sharpening the policy could reach at most)."""
    rows = []
    for t in problems:
        for steps in sorted({steps_of[p.program] for p in problems[t]}):
            values = [a for a, p in zip(acc[t], problems[t], strict=True) if steps_of[p.program] == steps]
            rows.append(
                {
                    "task_type": t,
                    "program_steps": steps,
                    "problems": len(values),
                    "per_sample": statistics.fmean(values),
                    "pass_at_k": statistics.fmean(a > 0 for a in values),
                }
            )
    return rows


def per_sample_accuracy(c: Any, member: Any, problems: dict[str, list[Any]], k: int, step: int, stream: str) -> dict:
    """Each problem's share of ``k`` sampled answers that are right (a dropped answer counts as wrong)."""
    from populora_core.cli.driver import solve

    attempts = [(t, member, p) for t in problems for p in problems[t]]
    answers = solve(c, attempts, step, stream, n=k).answers
    out: dict[str, list[float]] = {t: [] for t in problems}
    for (t, _, _), scored in zip(attempts, answers, strict=True):
        out[t].append(sum(bool(r.info["correct"]) for r in scored) / k)
    return out


def greedy_accuracy(c: Any, problems: dict[str, list[Any]], adapters: list[Any]) -> list[float]:
    """Each adapter's greedy accuracy (mean over task types), one answer per problem."""
    from populora_core.services.probe import greedy_grades

    graded = greedy_grades(c.engine, c.tasks, problems, adapters, c.recipe.rollout.solve_max_tokens)
    return [statistics.fmean(statistics.fmean(g.correct for g in v) for v in per.values()) for per in graded]


def mean_over_types(acc: dict[str, list[float]]) -> float:
    return statistics.fmean(statistics.fmean(v) for v in acc.values() if v)


def gains_by_type(arm: dict[str, list[float]], base: dict[str, list[float]], seed: int) -> dict[str, dict[str, Any]]:
    """Each task type's paired gain on its own: a type that loses can hide behind two that gain."""
    return {t: paired_gain({t: arm[t]}, {t: base[t]}, seed) for t in arm if arm[t]}


def paired_gain(arm: dict[str, list[float]], base: dict[str, list[float]], seed: int) -> dict[str, Any]:
    """Arm - base on the held-out problems: the mean over task types, its 95 % interval from the core's cluster
    bootstrap (problems the units, resampled within their task type, each pair kept together) and the design's
    minimum detectable effect (80 % power, two-sided 5 %), both as every study of the project computes them."""
    from populora_core.services.statistics import cluster_bootstrap, cluster_mde

    types = [t for t in arm if arm[t]]
    diffs = [[a - b] for t in types for a, b in zip(arm[t], base[t], strict=True)]
    strata = [t for t in types for _ in arm[t]]
    lo, hi = cluster_bootstrap(diffs, strata=strata, seed=seed)
    gain = mean_over_types({t: [a - b for a, b in zip(arm[t], base[t], strict=True)] for t in types})
    return {"gain": gain, "interval": [lo, hi], "mde": cluster_mde(diffs)}


#: Each task type's gold answer, as its solver is asked for it: the output, an input, the program.
GOLD = {"deduction": lambda p: p.outputs[0], "abduction": lambda p: p.inputs[0], "induction": lambda p: p.program}


class SupervisedArm:
    """One student's adapter trained on gold answers (``--supervised``); its PEFT model stays in memory between
    updates, and :meth:`save` writes the student's next version for the engine to evaluate."""

    def __init__(self, c: Any, student: Any, lr: float) -> None:
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(c.base_model.path)
        base = AutoModelForCausalLM.from_pretrained(c.base_model.path, dtype=torch.float32)
        self.model = PeftModel.from_pretrained(base, c.adapter_ref(student).path, is_trainable=True)
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=lr)

    def update(self, c: Any, problems: Sequence[tuple[str, Any]]) -> float:
        """One AdamW step on the problems' gold answers (cross-entropy on answer and EOS tokens); its loss."""
        import torch
        from populora_azr.prompts import format_solver_answer

        from benchmarks.research.nano.corpus import Example
        from benchmarks.research.nano.make_model import encode

        examples = [Example(t, c.tasks[t].solver_prompt(p), format_solver_answer(t, GOLD[t](p))) for t, p in problems]
        rows = encode(self.tokenizer, examples, self.model.config.max_position_embeddings)
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), width), self.tokenizer.eos_token_id, dtype=torch.long)
        attend = torch.zeros((len(rows), width), dtype=torch.long)
        weight = torch.zeros((len(rows), width))
        for r, (seq, prompt_len) in enumerate(rows):
            ids[r, : len(seq)] = torch.tensor(seq)
            attend[r, : len(seq)] = 1
            weight[r, prompt_len : len(seq)] = 1.0
        self.model.train()
        logits = self.model(input_ids=ids, attention_mask=attend).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="none"
        ).view(len(rows), width - 1)
        loss = (nll * weight[:, 1:]).sum() / weight[:, 1:].sum()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], 1.0)
        self.optimizer.step()
        return float(loss.detach())

    def save(self, c: Any, student: Any) -> None:
        student.version += 1
        self.model.save_pretrained(c.run_dir.adapter_path(student.version_name))


def cycle(problems: list[Any], rng: random.Random):
    """The pool over and over, reshuffled each pass: every problem used equally often."""
    while True:
        order = problems[:]
        rng.shuffle(order)
        yield from order


def run(args: argparse.Namespace, overrides: list[str], work: Path) -> dict[str, Any]:
    from populora_nano.probe import load_probe

    from populora_core.cli.driver import load_recipe, solve, start_run, train

    sizes = args.sizes
    recipe, resolved = load_recipe(
        args.recipe,
        [
            *overrides,
            f"seed={args.seed}",
            f"steps={args.steps}",
            "population.teachers=1",
            f"population.students={len(sizes)}",
            "population.mode=population",
            "probe.enabled=false",
            "evolution.every=0",
        ],
    )
    started = time.time()
    run = start_run(recipe, resolved, work / "run")
    try:
        c = run.components
        types = [t for t in TASK_TYPES if t in c.tasks]
        if any(n % len(types) or n < len(types) for n in sizes):
            raise SystemExit(
                f"--sizes {sizes}: each pool size must be a positive multiple of {len(types)} (task types)"
            )
        exclude = {p.program for p in load_probe()}
        (heldout, pool), steps_of = draw_problems(
            c.executor,
            types,
            [args.heldout, max(sizes) // len(types)],
            7919 + args.seed,
            exclude,
            args.max_program_steps,
        )
        drawn = time.time()
        print(
            f"  drew {len(types) * args.heldout} held-out and {max(sizes)} pool problems in {drawn - started:.0f} s",
            flush=True,
        )
        students = run.population.students
        base = per_sample_accuracy(c, students[0], heldout, args.k, 0, "transfer/heldout")
        base_greedy = greedy_accuracy(c, heldout, [None])[0]
        print(f"  base held-out greedy accuracy {100 * base_greedy:.1f} %", flush=True)
        shared = {t: pool[t][: min(sizes) // len(types)] for t in types}  # every arm trains on these
        base_shared = per_sample_accuracy(c, students[0], shared, args.k, 0, "transfer/train")
        print(f"  base held-out per-sample accuracy {100 * mean_over_types(base):.1f} %", flush=True)
        base_rows = breakdown(base, heldout, steps_of)
        for row in base_rows:
            print(
                f"    {row['task_type']:9s} {row['program_steps']}-step programs: {row['problems']:3d} problems, "
                f"per sample {100 * row['per_sample']:.1f} %, pass@{args.k} {100 * row['pass_at_k']:.0f} %",
                flush=True,
            )
        per_step = recipe.rollout.proposals_per_teacher
        streams = {
            (n, t): cycle(pool[t][: n // len(types)], random.Random(f"{args.seed}/{n}/{t}"))
            for n in sizes
            for t in types
        }
        # reinforcement learning: each step's training solve rate; --supervised: each step's gold-answer loss
        progress: dict[int, list[float]] = {n: [] for n in sizes}
        supervised: dict[int, SupervisedArm] = {}
        if args.supervised:
            supervised = {n: SupervisedArm(c, s, args.supervised_lr) for n, s in zip(sizes, students, strict=True)}
        train_start = time.time()
        for step in range(1, args.steps + 1):
            attempts = [
                (t, student, next(streams[n, t]))
                for n, student in zip(sizes, students, strict=True)
                for t in types
                for _ in range(per_step)
            ]
            arm_size = len(types) * per_step
            if supervised:
                for i, n in enumerate(sizes):
                    arm_problems = [(t, p) for t, _, p in attempts[i * arm_size : (i + 1) * arm_size]]
                    progress[n].append(supervised[n].update(c, arm_problems))
            else:
                answers = solve(c, attempts, step, "sample/solve", n=args.samples).answers
                train(c, run.population, [r for scored in answers for r in scored])
                for i, n in enumerate(sizes):
                    arm = answers[i * arm_size : (i + 1) * arm_size]
                    progress[n].append(statistics.fmean(bool(r.info["correct"]) for s in arm for r in s))
            if step % max(1, args.steps // 8) == 0 or step == args.steps:
                what = "gold-answer loss" if supervised else "training solve rate"
                shown = [statistics.fmean(progress[n][-4:]) for n in sizes]
                values = [f"{v:.3f}" if supervised else f"{100 * v:.0f} %" for v in shown]
                rates = ", ".join(f"N={n} {v}" for n, v in zip(sizes, values))
                print(f"  step {step:3d} ({time.time() - train_start:.0f} s): {what} {rates}", flush=True)
        for supervised_arm, student in zip(supervised.values(), students):
            supervised_arm.save(c, student)
        train_seconds = time.time() - train_start
        greedy = greedy_accuracy(c, heldout, [c.adapter_ref(student) for student in students])
        arms = []
        for n, student, greedy_acc in zip(sizes, students, greedy, strict=True):
            acc = per_sample_accuracy(c, student, heldout, args.k, args.steps + 1, "transfer/heldout")
            own = per_sample_accuracy(c, student, shared, args.k, args.steps + 1, "transfer/train")
            arms.append(
                {
                    "N": n,
                    "heldout": mean_over_types(acc),
                    "heldout_by_type": {t: statistics.fmean(v) for t, v in acc.items()},
                    "greedy": greedy_acc,
                    **paired_gain(acc, base, args.seed),
                    "gain_by_type": gains_by_type(acc, base, args.seed),
                    "trained_on": mean_over_types(own),
                    # the training solve rate (--supervised: the gold-answer loss), first and last eighth of the steps
                    "progress_first": statistics.fmean(progress[n][: max(1, args.steps // 8)]),
                    "progress_last": statistics.fmean(progress[n][-max(1, args.steps // 8) :]),
                    "per_problem": acc,
                }
            )
    finally:
        run.close()
    return {
        "base": base,
        "base_trained_on": mean_over_types(base_shared),
        "base_greedy": base_greedy,
        "base_breakdown": base_rows,
        "heldout_program_steps": {t: [steps_of[p.program] for p in heldout[t]] for t in types},
        "arms": arms,
        "train_seconds": train_seconds,
        "draw_seconds": drawn - started,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(REPO / "recipes" / "nano.yaml"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", type=int, nargs="+", default=[18, 72, 288, 1152], help="pool sizes N (x3)")
    parser.add_argument("--steps", type=int, default=64, help="updates per arm (64: N = 1152 is seen once)")
    parser.add_argument("--samples", type=int, default=None, help="answers per training problem (recipe's)")
    parser.add_argument("--heldout", type=int, default=100, help="held-out problems per task type")
    parser.add_argument("--k", type=int, default=8, help="sampled answers per held-out problem")
    parser.add_argument("--max-program-steps", type=int, default=None, help="only programs of at most 1-3 steps")
    parser.add_argument("--supervised", action="store_true", help="train on gold answers: the design's ceiling")
    parser.add_argument("--supervised-lr", type=float, default=2.0e-3, help="AdamW learning rate of --supervised")
    parser.add_argument("--quick", action="store_true", help="N = 6 / 12, 2 steps, 4 held-out problems per type")
    parser.add_argument("overrides", nargs="*", help="key.sub=value recipe overrides")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.quick:
        args.sizes, args.steps, args.heldout, args.k, args.samples = [6, 12], 2, 4, 2, 2
        overrides.append("rollout.proposals_per_teacher=2")
    if args.samples is None:
        from populora_core.cli.driver import load_recipe

        args.samples = load_recipe(args.recipe, overrides)[0].rollout.solver_samples
    start, cpu_start = time.time(), time.process_time()
    with tempfile.TemporaryDirectory(prefix="populora-transfer-") as tmp:
        result = run(args, overrides, Path(tmp))
    seconds = time.time() - start
    base = mean_over_types(result["base"])
    print(
        f"\nheld-out per-sample accuracy (%, k = {args.k}, {args.heldout} per task type) of one student trained "
        f"{args.steps} steps x {args.samples} answers on N problems; {args.recipe} {' '.join(overrides)}"
    )
    print(
        f"base: {100 * base:.1f} held-out ({100 * result['base_greedy']:.1f} greedy), "
        f"{100 * result['base_trained_on']:.1f} on the smallest pool"
    )
    progress = "gold-answer loss" if args.supervised else "solve rate"
    print(
        "| N | held-out | - base | 95 % interval | MDE | greedy | smallest pool (trained on by all) "
        f"| {progress} first / last |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for a in result["arms"]:
        lo, hi = a["interval"]
        mde = "-" if a["mde"] is None else f"{100 * a['mde']:.1f}"  # None: no problem's accuracy moved
        print(
            f"| {a['N']} | {100 * a['heldout']:.1f} | {100 * a['gain']:+.1f} | [{100 * lo:+.1f}, {100 * hi:+.1f}] | "
            f"{mde} | {100 * a['greedy']:.1f} | {100 * a['trained_on']:.1f} | "
            + (
                f"{a['progress_first']:.3f} / {a['progress_last']:.3f} |"
                if args.supervised
                else f"{100 * a['progress_first']:.0f} / {100 * a['progress_last']:.0f} |"
            )
        )
    types = list(result["base"])
    print(f"\nheld-out gain per task type, points [95 % interval]\n| N | {' | '.join(types)} |")
    print("|---|" + "---|" * len(types))
    for a in result["arms"]:
        cells = [a["gain_by_type"].get(t) for t in types]
        print(
            f"| {a['N']} | "
            + " | ".join(
                "-"
                if g is None
                else f"{100 * g['gain']:+.1f} [{100 * g['interval'][0]:+.1f}, {100 * g['interval'][1]:+.1f}]"
                for g in cells
            )
            + " |"
        )
    print(
        f"{seconds:.0f} s wall ({result['draw_seconds']:.0f} s drawing problems, {result['train_seconds']:.0f} s "
        f"training), this process {time.process_time() - cpu_start:.0f} CPU-s; CPU: {cpu_name()}"
    )
    summary = {
        "benchmark": "transfer",
        "recipe": args.recipe,
        "overrides": overrides,
        "steps": args.steps,
        "samples": args.samples,
        "k": args.k,
        "heldout_per_type": args.heldout,
        "max_program_steps": args.max_program_steps,
        "supervised_lr": args.supervised_lr if args.supervised else None,
        "seconds": round(seconds, 1),
        "cpu": cpu_name(),
        "base_heldout": base,
        "base_trained_on": result["base_trained_on"],
        "base_per_problem": result["base"],
        "base_greedy": result["base_greedy"],
        "base_breakdown": result["base_breakdown"],
        "heldout_program_steps": result["heldout_program_steps"],
        "arms": result["arms"],
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
