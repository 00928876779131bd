"""Probe evaluation: solver accuracy per task type and proposal validity on the fixed held-out set.

API (the model card's measurements and `benchmarks.transfer` call it; a run's probe is the core's
``populora_core.run.probe``; only core contracts are used, so any engine/task implementation works)::

    problems = load_probe()                                   # list[Problem] from probe.jsonl
    use_as_references(tasks, problems)                        # optional: references for proposals
    result = evaluate_probe(engine, {"base": None, "s0@v3": AdapterRef(...)}, tasks, problems)
    result["base"]["solver_accuracy"]["deduction"]            # fraction correct, greedy decoding

``tasks`` maps task-type names to Task components built with ``style: compact`` (the prompt format the
model was trained on); solver prompts come from ``task.solver_prompt`` and answers are graded by
``task.grade`` (in the task's executor). Proposal validity samples ``proposals`` proposer prompts per
task from ``task.proposer_prompts`` (the task's own buffer) and counts proposals that
``task.parse_proposals`` accepts. To compare with the model card, pass fresh tasks given the probe's programs as
references (:func:`use_as_references`); a run's live tasks give prompts with that run's references instead.

CLI (engine ``hf``, tasks and ``sandbox`` executor from the registry)::

    python -m populora_nano.probe [--adapter DIR ...] [--proposals 20] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from populora_azr.problems import CodeProblem, CodeProblemReader

from populora_core.api.components import AdapterRef, GenerationRequest, Problem, SamplingParams

from . import PROBE_FILE

TASK_TYPES = ("deduction", "abduction", "induction")
#: Greedy answer budget per task type, in tokens (the corpus's longest answers fit with room to spare).
SOLVER_MAX_TOKENS = {"deduction": 64, "abduction": 64, "induction": 160}
PROPOSER_MAX_TOKENS = 256


def load_probe(path: str | Path | None = None) -> list[CodeProblem]:
    """The probe problems as valid :class:`Problem` objects (JSON lines of Problem fields)."""
    from populora_core.api.errors import UserError
    from populora_core.api.problems import load_problems

    path = Path(path) if path is not None else PROBE_FILE
    problems: list[CodeProblem] = []
    for n, problem in enumerate(load_problems(path, _EveryType()), 1):
        assert isinstance(problem, CodeProblem), "_EveryType reads every record as a CodeProblem"
        if problem.task_type not in TASK_TYPES:
            raise UserError(f"probe file {path}, problem {n}: unknown task_type {problem.task_type!r}")
        problem.valid, problem.proposer = True, "probe"
        problems.append(problem)
    return problems


class _EveryType(Mapping[str, Any]):
    """Reads a record of any task type as an AZR code problem, so :func:`load_probe` names an unknown type itself."""

    def __getitem__(self, task_type: str) -> Any:
        return CodeProblemReader()

    def __iter__(self) -> Iterator[str]:
        return iter(TASK_TYPES)

    def __len__(self) -> int:
        return len(TASK_TYPES)


def use_as_references(tasks: Mapping[str, Any], problems: Sequence[Problem]) -> None:
    """Give each task the probe's problems as buffer entries (the references its proposer prompts show)."""
    for task in tasks.values():
        task.add_to_buffer([p for p in problems if p.task_type in ("deduction", "abduction")])


def evaluate_probe(
    engine: Any,
    adapters: Mapping[str, AdapterRef | None],
    tasks: Mapping[str, Any],
    problems: Sequence[Problem],
    *,
    proposals: int = 0,
    proposal_temperature: float = 1.0,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Per adapter (``None`` = the base model): greedy solver accuracy per task type, and with
    ``proposals > 0`` the proposal validity rate per task type.

    Returns ``{name: {"solver_accuracy": {task: acc, "mean": macro-average}, "formatted": {task: rate},
    "n": {task: count}, "proposal_validity": {task: rate}}}``; task types without problems (or without
    a task in ``tasks``) are left out. One ``engine.generate`` call per answer budget serves every adapter.
    """
    from populora_core.api.probe import greedy_grades

    names = list(adapters)
    out: dict[str, dict[str, Any]] = {name: {"solver_accuracy": {}, "formatted": {}, "n": {}} for name in names}
    by_type = {t: [p for p in problems if p.task_type == t] for t in TASK_TYPES if t in tasks}
    graded = greedy_grades(engine, tasks, by_type, [adapters[name] for name in names], SOLVER_MAX_TOKENS)
    for name, per_type in zip(names, graded):
        for task_type in TASK_TYPES:
            grades = per_type.get(task_type)
            if grades:
                out[name]["solver_accuracy"][task_type] = sum(g.correct for g in grades) / len(grades)
                out[name]["formatted"][task_type] = sum(g.formatted for g in grades) / len(grades)
                out[name]["n"][task_type] = len(grades)
    for name in names:
        accs = out[name]["solver_accuracy"]
        if accs:
            accs["mean"] = sum(accs.values()) / len(accs)
    if proposals > 0:
        for name in names:
            out[name]["proposal_validity"] = {}
        for t, task_type in enumerate(TASK_TYPES):
            task = tasks.get(task_type)
            if task is None:
                continue
            pairs = task.proposer_prompts(proposals, random.Random(seed * 1000 + t))
            requests = [GenerationRequest(prompt, adapters[name]) for name in names for prompt, _ in pairs]
            sampling = SamplingParams(
                n=1, temperature=proposal_temperature, max_tokens=PROPOSER_MAX_TOKENS, seed=seed + t
            )
            completions = engine.generate(requests, sampling)
            for k, name in enumerate(names):
                rows = completions[k * len(pairs) : (k + 1) * len(pairs)]
                parsed = task.parse_proposals([r[0].text for r in rows], [c for _, c in pairs], name)
                out[name]["proposal_validity"][task_type] = sum(p.valid for p in parsed) / len(parsed)
    return out


def _adapter_name(path: Path) -> str:
    return path.name or str(path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m populora_nano.probe", description=__doc__.split("\n")[0])
    ap.add_argument("--adapter", action="append", default=[], type=Path, help="PEFT adapter dir (repeatable)")
    ap.add_argument("--base-model", default="nano", help="registered base model name")
    ap.add_argument("--probe", type=Path, default=None, help="probe file (default: the shipped probe.jsonl)")
    ap.add_argument("--model-dir", type=Path, default=None, help="evaluate this model dir instead of --base-model")
    ap.add_argument("--proposals", type=int, default=20, help="proposer prompts per task type (0: skip)")
    ap.add_argument("--limit", type=int, default=None, help="first N problems per task type")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also write the result JSON here")
    args = ap.parse_args(argv)

    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from populora_core.api import get_registry
    from populora_core.api.components import BaseModel, LoraSettings

    reg = get_registry()
    if args.model_dir is not None:
        base = BaseModel(path=str(args.model_dir), name=args.model_dir.name, dtype="float32")
    else:
        base = reg.base_model(args.base_model)
    problems = load_probe(args.probe)
    if args.limit is not None:
        problems = [p for t in TASK_TYPES for p in [q for q in problems if q.task_type == t][: args.limit]]
    executor = reg.get("executor", "sandbox").build()
    try:
        tasks: dict[str, Any] = {}
        for name in TASK_TYPES:
            tasks[name] = reg.get("task", name).build(
                {"style": "compact"}, executor=executor, rng=args.seed, tasks=tasks
            )
        use_as_references(tasks, problems)
        engine = reg.get("engine", "hf").build(base_model=base, lora=LoraSettings(), seed=args.seed)
        adapters: dict[str, AdapterRef | None] = {"base": None}
        for path in args.adapter:
            adapters[_adapter_name(path)] = AdapterRef(_adapter_name(path), str(path))
        try:
            result = evaluate_probe(engine, adapters, tasks, problems, proposals=args.proposals, seed=args.seed)
        finally:
            engine.close()
    finally:
        executor.close()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
