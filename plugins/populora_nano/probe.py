"""Probe evaluation: solver accuracy per task type and proposal validity on the fixed held-out set.

API (the model card's measurements and `benchmarks.research.transfer` call it; a run's probe is the core's
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

The model card's measurement CLI is nano's build tooling: ``python -m benchmarks.research.nano.probe``.
"""

from __future__ import annotations

import random
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
    from populora_core.services.problems import load_problems

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
    from populora_core.services.probe import greedy_grades

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
