"""``nano_heldout``: held-out problems of nano's own distribution, what ``populora eval`` measures nano on.

The paper's benchmarks ask for long programs and competition maths that a 1.4 M-parameter model trained for 20 CPU
minutes cannot write (it scores 0 on them); this set asks what nano was trained to do, on problems it never saw:
``heldout.jsonl`` holds 50 deduction, 50 abduction and 50 induction problems drawn like the probe set from another
seed, their programs neither in the training corpus nor in ``probe.jsonl`` (which a run's probe uses), checked by
the AZR tasks themselves. Answers are graded by those tasks (``style: compact``) in the executor ``populora eval``
hands over. Items alternate task types, so ``--limit N`` keeps the three balanced.

``python -m benchmarks.research.nano.make_heldout`` redraws it (nano's build tooling).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from populora_core.api import Params, UserError
from populora_core.api.components import Evaluator, Executor, Problem
from populora_core.services.problems import ProblemFileEvaluator

HELDOUT_FILE = Path(__file__).resolve().parent / "heldout.jsonl"
TASK_TYPES = ("deduction", "abduction", "induction")


class HeldoutParams(Params):
    """Settings of ``nano_heldout``; the defaults are what nano's probe uses."""

    path: str | None = Field(None, description="another JSONL file of Problem records instead of heldout.jsonl")
    max_tokens: int = Field(160, ge=1, description="answer budget (induction's programs need 160; the rest stop early)")
    timeout_s: float | None = Field(None, gt=0, description="seconds per graded program (None: the tasks' default)")


class NanoHeldout(ProblemFileEvaluator, Evaluator):
    """Greedy answers graded by the AZR tasks; category ``code`` (programs run in the executor)."""

    name = "nano_heldout"
    category = "code"
    package = "populora_nano"
    template = "compact"  # the AZR prompt style nano was trained on

    def __init__(self, params: HeldoutParams) -> None:
        self.params = params
        self.max_tokens = params.max_tokens
        self.file = Path(params.path).expanduser() if params.path else HELDOUT_FILE
        self._items: list[dict[str, Any]] | None = None
        self._prompting: dict[str, Any] | None = None

    def items(self, limit: int | None = None) -> list[dict[str, Any]]:
        if self._items is None:
            from .probe import load_probe

            if not self.file.is_file():
                raise UserError(f"{self.name}: no problem file at {self.file}")
            by_type = {t: [p for p in load_probe(self.file) if p.task_type == t] for t in TASK_TYPES}
            rounds = max(map(len, by_type.values()))
            self._items = [
                {"id": f"{t}/{k}", "problem": by_type[t][k]}
                for k in range(rounds)
                for t in TASK_TYPES
                if k < len(by_type[t])
            ]
        return self._items if limit is None else self._items[:limit]

    def _tasks(self, executor: Executor | None) -> dict[str, Any]:
        from populora_core.api import get_registry

        registry = get_registry()
        params: dict[str, Any] = {"style": "compact"}
        if self.params.timeout_s is not None:
            params["timeout_s"] = self.params.timeout_s
        tasks: dict[str, Any] = {}
        for name in TASK_TYPES:
            # deduction's and abduction's proposer references as recipes/nano.yaml sets them (nothing proposes here)
            extra = {} if name == "induction" else {"references": 3}
            tasks[name] = registry.get("task", name).build({**params, **extra}, executor=executor, rng=0, tasks=tasks)
        return tasks

    def prompt(self, item: dict[str, Any]) -> str:
        if self._prompting is None:
            self._prompting = self._tasks(None)  # a prompt needs no executor
        problem: Problem = item["problem"]
        return self._prompting[problem.task_type].solver_prompt(problem)

    def stop(self) -> tuple[str, ...]:
        return ()  # nano ends an answer with EOS

    def extract(self, completion: str) -> str:
        return completion

    def grade(
        self, items: Sequence[dict[str, Any]], completions: Sequence[Sequence[str]], executor: Executor | None = None
    ) -> list[list[bool]]:
        if executor is None:
            raise UserError(f"{self.name}: grading runs programs, so it needs an executor (the sandbox)")
        tasks = self._tasks(executor)
        out: list[list[bool]] = [[] for _ in items]
        for name, task in tasks.items():
            mine = [i for i, item in enumerate(items) if item["problem"].task_type == name]
            if mine:
                graded = task.grade_many([(items[i]["problem"], list(completions[i])) for i in mine])
                for i, grades in zip(mine, graded):
                    out[i] = [g.correct for g in grades]
        return out
