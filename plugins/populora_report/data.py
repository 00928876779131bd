"""Reading a run directory into plain series for the report: no matplotlib, no torch.

Logs are read tolerantly: a torn last line (a run killed mid-write) is skipped and noted rather
than failing the whole report, since a report of a crashed run is exactly when one is wanted.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from populora_core.api import UserError, format_validation_error
from populora_core.api.schema import PopulationSection

from . import dynamics

COUNTERS = ("rollouts", "estimation_rollouts", "tokens", "trained_tokens", "updates")
COMPLEXITY = (("ast_depth", "AST depth"), ("cyclomatic", "cyclomatic complexity"), ("loc", "lines of code"))
#: What the report keeps of a problem record besides its ``metric_*`` (not the program texts of a long run)
PROBLEM_KEYS = ("step", "valid", "signature", "task_type", "teacher_program")


def _read_jsonl(file: Path, notes: list[str]) -> list[dict[str, Any]] | None:
    """Records of a JSONL log, None when the file is absent; unparsable lines are skipped and noted."""
    if not file.is_file():
        return None
    out, bad = [], 0
    with open(file) as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(record, dict):
                out.append(record)
            else:
                bad += 1
    if bad:
        notes.append(f"{file.name}: skipped {bad} unreadable line(s)")
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) else float(value)


@dataclass
class ProbeSummary:
    """Accuracy of one probed adapter at one probe step: per task type and n-weighted overall."""

    member: str
    version: str
    role: str
    step: int
    by_type: dict[str, float]
    n: int
    overall: float


@dataclass
class RunData:
    path: Path
    label: str
    name: str
    mode: str
    recipe: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    lineage: list[dict[str, Any]] = field(default_factory=list)
    members_final: list[dict[str, Any]] = field(default_factory=list)
    problems: list[dict[str, Any]] | None = None
    probe: list[dict[str, Any]] | None = None
    notes: list[str] = field(default_factory=list)

    # --- who is who ---------------------------------------------------------------------------

    @property
    def is_baseline(self) -> bool:
        return self.mode == "single_agent"

    @property
    def final_step(self) -> int:
        return max((r["step"] for r in self.steps), default=0)

    def member_ids(self) -> list[str]:
        """Every member ever seen, ordered by birth step then id (stable colours across figures)."""
        seen: dict[str, int] = {}
        for rec in self.lineage:
            if rec.get("member"):
                seen.setdefault(rec["member"], int(rec.get("step", 0)))
        for m in self.members_final:
            seen.setdefault(m["id"], int(m.get("born_step", 0)))
        for rec in self.steps:
            for key in rec:
                if key.startswith("member/"):
                    seen.setdefault(key.split("/")[1], rec["step"])
        return sorted(seen, key=lambda m: (seen[m], _id_key(m)))

    def roles(self) -> dict[str, str]:
        """Role per member from lineage/members.json, else guessed from which metrics it has."""
        out: dict[str, str] = {}
        for rec in self.lineage:
            if rec.get("member") and rec.get("role"):
                out[rec["member"]] = rec["role"]
        for m in self.members_final:
            out.setdefault(m["id"], m.get("role", ""))
        for member in self.member_ids():
            if member not in out:
                student = any(f"member/{member}/solve_rate" in r for r in self.steps)
                teacher = any(f"member/{member}/validity" in r for r in self.steps)
                out[member] = "both" if student and teacher else "student" if student else "teacher"
        return out

    def students(self) -> list[str]:
        roles = self.roles()
        return [m for m in self.member_ids() if roles.get(m) in ("student", "both")]

    def teachers(self) -> list[str]:
        roles = self.roles()
        return [m for m in self.member_ids() if roles.get(m) in ("teacher", "both")]

    def births(self) -> dict[str, int]:
        out = {m: 0 for m in self.member_ids()}
        for rec in self.lineage:
            if rec.get("member"):
                out[rec["member"]] = int(rec.get("step", 0))
        return out

    def deaths(self) -> dict[str, int]:
        """Step at which each replaced member was removed by evolution."""
        return {rec["replaced"]: int(rec["step"]) for rec in self.lineage if rec.get("replaced")}

    def children(self) -> list[dict[str, Any]]:
        return [rec for rec in self.lineage if rec.get("operator") != "init" and rec.get("parents")]

    # --- series -------------------------------------------------------------------------------

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a step-record key, skipping steps where it is absent or None."""
        xs, ys = [], []
        for rec in self.steps:
            value = _number(rec.get(key))
            if value is not None:
                xs.append(rec["step"])
                ys.append(value)
        return xs, ys

    def member_series(self, member: str, metric: str) -> tuple[list[int], list[float]]:
        return self.series(f"member/{member}/{metric}")

    def problem_metric_mean(self, metric: str) -> tuple[list[int], list[float]]:
        """Mean of a program metric over every valid proposal of a step whose program the teacher wrote (all
        teachers together; AZR's induction programs come from the buffers): :func:`dynamics.complexity_series`."""
        return dynamics.complexity_series(self.problems or [], metric)

    def task_names(self, metric: str) -> list[str]:
        """Task types that logged ``task/<name>/<metric>`` at some step, in order of first appearance."""
        names: dict[str, None] = {}
        for rec in self.steps:
            for key in rec:
                parts = key.split("/", 1)
                if parts[0] == "task" and len(parts) == 2 and parts[1].endswith("/" + metric):
                    names.setdefault(parts[1][: -len(metric) - 1], None)
        return list(names)

    def task_series(self, metric: str) -> dict[str, tuple[list[int], list[float]]]:
        """Per task type, (steps, values) of ``task/<name>/<metric>`` (steps where it is absent or None skipped)."""
        return {name: self.series(f"task/{name}/{metric}") for name in self.task_names(metric)}

    # --- difficulty (tasks that declare levels: populora_core/run/metrics.py) -------------------------

    def difficulty_scopes(self) -> list[str]:
        """Where the steps logged difficulty: ``""`` when one task declares levels (``teacher/difficulty``),
        ``"<task>/"`` per task when several do (``teacher/<task>/difficulty``); empty: none logged."""
        scopes: dict[str, None] = {}
        for rec in self.steps:
            for key in rec:
                if key.startswith("teacher/") and key.endswith("difficulty"):
                    scopes.setdefault(key[len("teacher/") : -len("difficulty")], None)
        return list(scopes)

    def level_members(self, scope: str) -> dict[str, list[int]]:
        """Students that logged a solve rate per level in ``scope`` (birth order) -> the levels, ascending."""
        found: dict[str, set[int]] = defaultdict(set)
        for rec in self.steps:
            for key in rec:
                parts = key.split("/")
                head, level = "/".join(parts[2:-1]), parts[-1]
                if parts[0] == "member" and head == f"{scope}solve_rate_at_level" and level.isdigit():
                    found[parts[1]].add(int(level))
        return {m: sorted(found[m]) for m in self.member_ids() if m in found}

    def proposal_coverage(self) -> tuple[list[int], list[int]]:
        """Cumulative distinct signatures of valid proposals over the whole population."""
        if not self.problems:
            return [], []
        by_step: dict[int, set[str]] = defaultdict(set)
        for p in self.problems:
            if p.get("valid") and p.get("signature") and isinstance(p.get("step"), int):
                by_step[p["step"]].add(p["signature"])
        seen: set[str] = set()
        xs, ys = [], []
        for step in sorted(by_step):
            seen |= by_step[step]
            xs.append(step)
            ys.append(len(seen))
        return xs, ys

    def counters(self) -> dict[str, dict[str, int | float]]:
        """Final compute counters of every member ever: live ones from members.json, dead ones
        from the last step record they appear in (children start from zero, so these add up)."""
        out: dict[str, dict[str, int | float]] = {}
        for rec in self.steps:
            for key, value in rec.items():
                parts = key.split("/")
                if len(parts) == 4 and parts[0] == "member" and parts[2] == "counters":
                    if _number(value) is not None:
                        out.setdefault(parts[1], {})[parts[3]] = value
        for m in self.members_final:
            for k, v in (m.get("counters") or {}).items():
                if _number(v) is not None:
                    out.setdefault(m["id"], {})[k] = v
        order = self.member_ids()
        return {m: out[m] for m in sorted(out, key=lambda m: order.index(m) if m in order else len(order))}

    def seconds(self) -> dict[str, float]:
        total = sum(_number(r.get("time/step")) or 0.0 for r in self.steps)
        model = sum(
            _number(r.get(f"time/{p}")) or 0.0
            for r in self.steps
            for p in ("generate_propose", "generate_solve", "train")
        )
        return {"total": total, "model": model}

    def measures(self) -> dict[str, float | None]:
        """The study's dynamics measures of this run (:func:`dynamics.measure_run`)."""
        return dynamics.measure_run(self.steps, self.problems or [], self.probe or [])

    # --- probe ------------------------------------------------------------------------------

    def probe_summaries(self) -> list[ProbeSummary]:
        """One summary per (step, member) of probe.jsonl, in file order."""
        if not self.probe:
            return []
        grouped: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for rec in self.probe:
            acc = _number(rec.get("accuracy"))
            if acc is None or not isinstance(rec.get("step"), int) or not rec.get("member"):
                continue
            grouped.setdefault((rec["step"], str(rec["member"])), []).append(rec)
        out = []
        for (step, member), recs in grouped.items():
            by_type = {str(r.get("task_type", "?")): float(r["accuracy"]) for r in recs}
            weights = [max(int(_number(r.get("n")) or 1), 1) for r in recs]
            n = sum(weights)
            overall = sum(float(r["accuracy"]) * w for r, w in zip(recs, weights)) / n
            out.append(
                ProbeSummary(
                    member,
                    str(recs[-1].get("version", member)),
                    str(recs[-1].get("role", "")),
                    step,
                    by_type,
                    n,
                    overall,
                )
            )
        return out

    def probe_final(self) -> list[ProbeSummary]:
        """Probed students (role student/both) at the last probe step that probed students."""
        students = [s for s in self.probe_summaries() if s.member != "base" and s.role != "base"]
        if not students:
            return []
        last = max(s.step for s in students)
        return [s for s in students if s.step == last]

    def probe_base(self) -> ProbeSummary | None:
        bases = [s for s in self.probe_summaries() if s.member == "base" or s.role == "base"]
        return max(bases, key=lambda s: s.step) if bases else None

    def probe_outcomes(self, member: str, step: int, *, sampled: bool = False) -> dict[str, list[float]]:
        """Task type -> each probe problem's outcome of ``member`` at ``step``, in probe order: greedy 1 correct,
        0 not; ``sampled``: the share of its k sampled answers that were right. A task type whose record has no
        valid list (runs recorded before it was, or probed greedily only) is left out."""
        out: dict[str, list[float]] = {}
        for rec in self.probe or []:
            values = rec.get("sample_correct" if sampled else "correct")
            k = rec.get("samples") if sampled else 1
            if rec.get("member") != member or rec.get("step") != step or not isinstance(values, list):
                continue
            if isinstance(k, int) and k > 0 and all(isinstance(c, int) and 0 <= c <= k for c in values):
                out[str(rec.get("task_type", "?"))] = [c / k if sampled else int(c) for c in values]
        return out

    def probe_samples(self) -> int | None:
        """The probe's k sampled answers per problem (None: greedy only)."""
        return next((r["samples"] for r in self.probe or [] if isinstance(r.get("samples"), int)), None)

    def probe_task_types(self) -> list[str]:
        types: list[str] = []
        for s in self.probe_summaries():
            for t in s.by_type:
                if t not in types:
                    types.append(t)
        return types


def _id_key(member: str) -> tuple[str, int]:
    prefix = member.rstrip("0123456789")
    digits = member[len(prefix) :]
    return prefix, int(digits) if digits else -1


def load_run(path: str | Path) -> RunData:
    """Everything the report needs from one run directory; a UserError if it is not one."""
    directory = Path(path)
    if not directory.is_dir():
        raise UserError(f"{directory}: no such run directory")
    recipe_file = directory / "recipe.yaml"
    if not recipe_file.is_file():
        raise UserError(f"{directory} is not a run directory (no recipe.yaml)")
    try:
        recipe = yaml.safe_load(recipe_file.read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"{recipe_file}: not valid YAML ({exc})") from None
    if not isinstance(recipe, dict):
        raise UserError(f"{recipe_file} is not a recipe mapping")
    try:  # the schema's defaults, not the report's: a run writes its resolved recipe, a hand-made one may not
        population = PopulationSection.model_validate(recipe.get("population") or {})
    except ValidationError as exc:
        raise UserError(f"{recipe_file}: population: {format_validation_error(exc)}") from None
    notes: list[str] = []
    events = _read_jsonl(directory / "events.jsonl", notes)
    if events is None:
        notes.append("no events.jsonl: the run has not logged a step yet")
        events = []
    by_step: dict[int, dict[str, Any]] = {}
    for rec in events:
        if rec.get("event") == "step" and isinstance(rec.get("step"), int):
            by_step[rec["step"]] = rec  # a resumed run's repeated step: keep the last
    if events and not by_step:
        notes.append("events.jsonl holds no step records")
    lineage = _read_jsonl(directory / "lineage.jsonl", notes)
    if lineage is None:
        notes.append("no lineage.jsonl")
    members_final: list[dict[str, Any]] = []
    members_file = directory / "members.json"
    if members_file.is_file():
        try:
            data = json.loads(members_file.read_text())
            members_final = [m for m in data.get("members", []) if isinstance(m, dict) and "id" in m]
        except (json.JSONDecodeError, AttributeError):
            notes.append("members.json is unreadable")
    else:
        notes.append("no members.json (no checkpoint yet)")
    problems = _read_jsonl(directory / "tasks" / "problems.jsonl", notes)
    if problems is None:
        notes.append("no tasks/problems.jsonl")
    else:  # keep what the figures use, not every program text of a long run
        problems = [{k: v for k, v in p.items() if k in PROBLEM_KEYS or k.startswith("metric_")} for p in problems]
    probe = _read_jsonl(directory / "probe.jsonl", notes)
    if probe is None:
        notes.append("no probe.jsonl: probe evaluation was not run")
    return RunData(
        path=directory,
        label=directory.resolve().name,
        name=str(recipe.get("name", directory.name)),
        mode=population.mode,
        recipe=recipe,
        steps=[by_step[s] for s in sorted(by_step)],
        lineage=lineage or [],
        members_final=members_final,
        problems=problems,
        probe=probe,
        notes=notes,
    )


def load_runs(paths: list[str | Path]) -> list[RunData]:
    """Load several runs, giving each a unique label (directory name, with the recipe name if it differs)."""
    if not paths:
        raise UserError("populora report needs at least one RUN_DIR")
    runs = [load_run(p) for p in paths]
    for run in runs:
        if run.name != run.label:
            run.label = f"{run.label} ({run.name})"
    counts: dict[str, int] = defaultdict(int)
    for run in runs:
        counts[run.label] += 1
    if any(c > 1 for c in counts.values()):
        for run in runs:
            if counts[run.label] > 1:
                run.label = f"{run.path.resolve().parent.name}/{run.label}"
    seen: dict[str, int] = defaultdict(int)
    for run in runs:
        seen[run.label] += 1
        if seen[run.label] > 1:
            run.label = f"{run.label} #{seen[run.label]}"
    return runs


@dataclass
class Arm:
    """Runs of one experiment that differ only in their seed: pooled, they give an interval over seeds."""

    label: str
    runs: list[RunData]

    @property
    def is_baseline(self) -> bool:
        return all(r.is_baseline for r in self.runs)


def arms(runs: list[RunData]) -> list[Arm]:
    """Group runs into arms: equal resolved recipes but for ``seed`` and ``cluster`` (where a run computes
    never changes what it computes), in order of first appearance; labelled by recipe name."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        key = json.dumps({k: v for k, v in run.recipe.items() if k not in ("seed", "cluster")}, sort_keys=True)
        groups.setdefault(key, []).append(run)
    out = [Arm(members[0].name, members) for members in groups.values()]
    names: dict[str, int] = defaultdict(int)
    for arm in out:
        names[arm.label] += 1
    for arm in out:
        if names[arm.label] > 1:  # same recipe name, different settings: name the arm by its first run
            arm.label = arm.runs[0].label
    return out
