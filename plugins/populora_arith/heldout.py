"""``arith_heldout``: the world's held-out problems, every level, what ``populora eval`` and the study measure.

``heldout.jsonl`` holds 640 problems (40 of level 1, which has only 100 in all, and 120 of each other level),
drawn by ``benchmarks/research/arith/make_model.py`` before anything else and never in the base's training stream
nor in ``probe.jsonl`` (the run's probe set). Loading refuses a file that shares a problem with the probe set,
naming the problems. Items alternate levels, so ``--limit N`` keeps every level.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from populora_core.api import Params, UserError
from populora_core.api.components import Evaluator, Executor
from populora_core.services.problems import ProblemFileEvaluator

from . import HELDOUT_FILE, PROBE_FILE, world


def read_problems(path: Path) -> list[tuple[int, int]]:
    """``(a, b)`` of every record of an ``arith`` problem file, each checked against the grammar."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            out.append(world.parse_question(world.question(int(record["a"]), int(record["b"]))))
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}:{n}: not an arith problem ({exc})") from None
    return out


def overlap(held_out: Iterable[tuple[int, int]], others: dict[str, Iterable[tuple[int, int]]]) -> str | None:
    """What a held-out set shares with each other set (a training corpus, a probe set), or None."""
    mine = set(held_out)
    found = []
    for name, problems in others.items():
        shared = sorted(mine & set(problems))
        if shared:
            shown = ", ".join(world.question(a, b) for a, b in shared[:5])
            found.append(f"{len(shared)} with {name} ({shown}{', ...' if len(shared) > 5 else ''})")
    return "; ".join(found) or None


class HeldoutParams(Params):
    """Settings of ``arith_heldout``."""

    path: str | None = Field(None, description="another JSONL file of arith problems instead of heldout.jsonl")


class ArithHeldout(ProblemFileEvaluator, Evaluator):
    """Answers graded exactly, per level; no executor."""

    name = "arith_heldout"
    category = "math"
    package = "populora_arith"
    template = "arith"  # the world's own prompt (world.solver_prompt); what eval's cache key records
    max_tokens = world.MAX_DIGITS + 2

    def __init__(self, params: HeldoutParams) -> None:
        self.params = params
        self.file = Path(params.path).expanduser() if params.path else HELDOUT_FILE
        self._items: list[dict[str, Any]] | None = None

    def items(self, limit: int | None = None) -> list[dict[str, Any]]:
        if self._items is None:
            if not self.file.is_file():
                raise UserError(f"{self.name}: no problem file at {self.file}")
            problems = read_problems(self.file)
            shared = overlap(problems, {f"the probe set {PROBE_FILE}": read_problems(PROBE_FILE)})
            if shared:
                raise UserError(f"{self.name}: {self.file} is not held out: it shares {shared}")
            by_level = {lv: [p for p in problems if world.level(*p) == lv] for lv in world.LEVELS}
            rounds = max(map(len, by_level.values()))
            self._items = [
                {"id": f"L{lv}/{k}", "level": lv, "a": by_level[lv][k][0], "b": by_level[lv][k][1]}
                for k in range(rounds)
                for lv in world.LEVELS
                if k < len(by_level[lv])
            ]
        return self._items if limit is None else self._items[:limit]

    def prompt(self, item: dict[str, Any]) -> str:
        return world.solver_prompt(item["a"], item["b"])

    def stop(self) -> tuple[str, ...]:
        return ()  # the base ends an answer with EOS

    def extract(self, completion: str) -> str:
        return completion.strip()

    def grade(
        self, items: Sequence[dict[str, Any]], completions: Sequence[Sequence[str]], executor: Executor | None = None
    ) -> list[list[bool]]:
        return [
            [text.strip() == world.answer(item["a"], item["b"]) for text in texts]
            for item, texts in zip(items, completions, strict=True)
        ]
