"""A light, deterministic stand-in stack for testing the core loop without model compute.

Loaded with ``populora --plugin tests/fake_stack.py`` (which also tests local plugin files) or
registered directly in tests. Components are real implementations of the core Protocols, only
trivially cheap: the engine's "model" reads a number off the adapter weights, the trainer nudges B.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from populora_core import Params, hookimpl
from populora_core.api.components import (
    BaseModel,
    Completion,
    Executor,
    Grade,
    Problem,
    RolloutEngine,
    Task,
    Trainer,
    UpdateStats,
    problem_from_record,
)


class FakeEngineParams(Params):
    delay_s: float = Field(0.0, ge=0)


class FakeEngine(RolloutEngine):
    """Answers with a number derived from the adapter's weights, the prompt and the seed.

    A prompt counts one token per character against ``sampling.max_prompt_tokens``."""

    def __init__(self, params: FakeEngineParams, *, base_model: Any, lora: Any, seed: int) -> None:
        self.params = params

    def generate(self, requests: Any, sampling: Any) -> list[list[Completion]]:
        from populora_core.services.adapters import load_lora

        time.sleep(self.params.delay_s)
        out = []
        for r_i, req in enumerate(requests):
            level = 0.0
            if req.adapter is not None:
                w = load_lora(req.adapter.path)
                level = float(sum(f.B.abs().sum() for f in w.modules.values()))
            if sampling.max_prompt_tokens is not None and len(req.prompt) > sampling.max_prompt_tokens:
                out.append([Completion("", [], [], [3, 4, 5], "prompt_too_long") for _ in range(sampling.n)])
                continue
            row = []
            for j in range(sampling.n):
                value = int(level * 1000 + len(req.prompt) + (sampling.seed or 0) + r_i + j) % 7
                text = str(value) if value else "oops"
                logprobs = [-0.5, -0.1] if sampling.logprobs else []  # as engines do: only when asked
                row.append(Completion(text, [value, 1], logprobs, [3, 4, 5], "length" if value == 6 else "stop"))
            out.append(row)
        return out

    def sleep(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeTrainerParams(Params):
    lr: float = 0.01
    # a test's pause inside a checkpoint's write: save_state of step save_pause_step's checkpoint writes the marker
    # file, then sleeps (a second stop signal lands mid-write)
    save_pause_step: int = 0
    save_pause_marker: str = ""


class FakeTrainer(Trainer):
    """Moves B by lr * mean reward * a member-seeded direction; 'optimizer state' is a reward EMA."""

    def __init__(self, params: FakeTrainerParams, *, base_model: Any, lora: Any, seed: int) -> None:
        self.params, self.seed, self.state = params, seed, {}

    def update(self, member_id: str, adapter: Any, rollouts: Any, out_dir: Path) -> UpdateStats:
        import torch

        from populora_core.api.lora import LoraFactors
        from populora_core.services.adapters import load_lora, save_lora

        mean = sum(r.reward for r in rollouts) / len(rollouts)
        ema = 0.9 * self.state.get(member_id, 0.0) + 0.1 * mean
        self.state[member_id] = ema
        w = load_lora(adapter.path)
        gen = torch.Generator().manual_seed(self.seed + sum(map(ord, adapter.name)))
        modules = {
            n: LoraFactors(f.A, f.B + self.params.lr * (mean + ema) * torch.randn(f.B.shape, generator=gen), f.scale)
            for n, f in w.modules.items()
        }
        save_lora(w.with_modules(modules), out_dir)
        return UpdateStats(loss=-mean, tokens=sum(len(r.completion_token_ids) for r in rollouts))

    def copy_state(self, source_member: str, target_member: str) -> None:
        self.state[target_member] = self.state.get(source_member, 0.0)

    def forget(self, member_id: str) -> None:
        self.state.pop(member_id, None)

    def save_state(self, directory: Path) -> None:
        (Path(directory) / "state.json").write_text(json.dumps(self.state))
        step = Path(directory).parent.name.lstrip(".").split(".")[0]  # checkpoints/.<step>.<pid>-<hex>/trainer
        if self.params.save_pause_step and step.isdigit() and int(step) == self.params.save_pause_step:
            Path(self.params.save_pause_marker).write_text(step)
            time.sleep(120)

    def load_state(self, directory: Path) -> None:
        self.state = json.loads((Path(directory) / "state.json").read_text())


class CountTaskParams(Params):
    """Proposals are digits 1-6; a solver must answer the same digit."""


@dataclass
class CountProblem(Problem):
    """The count task's payload: the digit as a one-line "program", one input and one output."""

    program: str
    inputs: list[str]
    outputs: list[str]


class CountTask(Task[CountProblem]):
    name = "count"
    problem_type = CountProblem
    teacher_metrics = ("ast_depth", "cyclomatic", "loc")

    def __init__(self, params: Any) -> None:  # a factory declaring params alone: it is handed no run context
        self.buffer: list[CountProblem] = []

    def proposer_prompts(self, count: int, rng: Any) -> list[tuple[str, Any]]:
        return [(f"propose {rng.randrange(100)}", None) for _ in range(count)]

    def parse_proposals(self, completions: Any, contexts: Any, proposer: Any) -> list[CountProblem]:
        out = []
        for text, who in zip(completions, proposer):
            valid = text.isdigit()
            out.append(
                CountProblem(
                    "count",
                    text,
                    [text],
                    [text],
                    valid=valid,
                    error=None if valid else "not a digit",
                    proposer=who,
                    metrics={"ast_depth": 1, "cyclomatic": 1, "loc": 1},
                    signature=f"sig{text}",
                )
            )
        return out

    def problem_metrics(self, problems: Any) -> dict[str, Any]:
        """What the loop logs as ``task/count/<key>``: the mean input length and the distinct programs."""
        lengths = [len(p.inputs[0]) for p in problems]
        return {
            "input_chars": sum(lengths) / len(lengths) if lengths else None,
            "distinct_programs": len({p.program for p in problems}),
        }

    def solver_prompt(self, problem: CountProblem) -> str:
        return f"solve {problem.program}"

    def grade(self, problem: CountProblem, answers: Any) -> list[Grade]:
        grades = []
        for a in answers:
            correct = a == problem.program
            grades.append(Grade(1.0 if correct else (-0.5 if a.isdigit() else -1.0), correct, a.isdigit()))
        return grades

    def proposer_reward(self, problem: CountProblem, solve_rate: float | None) -> float:
        if solve_rate is None:
            return -1.0
        return 1 - solve_rate if 0 < solve_rate < 1 else -0.5

    def add_to_buffer(self, problems: Any) -> None:
        self.buffer.extend(problems)

    def sample_problems(self, count: int, rng: Any) -> list[CountProblem]:
        return [rng.choice(self.buffer) for _ in range(count)] if self.buffer else []

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": [dataclasses.asdict(p) for p in self.buffer]}  # JSON data: a checkpoint holds data

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer = [problem_from_record(CountProblem, d) for d in state["buffer"]]


class NullExecutor(Executor):
    def __init__(self, params: Any) -> None:
        pass

    def run_batch(self, jobs: Any) -> list[Any]:
        return []

    def close(self) -> None:
        pass


class FakeBaseParams(Params):
    path: str = Field(default_factory=lambda: os.environ.get("POPULORA_TEST_MODEL", ""))


def fake_base(params: FakeBaseParams) -> BaseModel:
    return BaseModel(path=params.path, name="fake")


@hookimpl
def register_engines(register):
    register("fake", FakeEngine, params=FakeEngineParams)


@hookimpl
def register_trainers(register):
    register("fake", FakeTrainer, params=FakeTrainerParams)


@hookimpl
def register_tasks(register):
    register("count", CountTask, params=CountTaskParams)


@hookimpl
def register_executors(register):
    register("noop", NullExecutor)


@hookimpl
def register_base_models(register):
    register("fake_base", fake_base, params=FakeBaseParams)


class NoiseParams(Params):
    std: float = Field(0.01, gt=0)


def noise_mutation(parents: list[Any], params: NoiseParams, generator: Any) -> Any:
    """Parent plus Gaussian noise on B (a mutation for loop tests)."""
    import torch

    from populora_core.api.lora import LoraFactors

    (p,) = parents
    return p.with_modules(
        {
            n: LoraFactors(f.A, f.B + params.std * torch.randn(f.B.shape, generator=generator), f.scale)
            for n, f in p.modules.items()
        }
    )


class BlendParams(Params):
    mix: float = Field(0.5, ge=0, le=1)


def b_blend(parents: list[Any], params: BlendParams, generator: Any) -> Any:
    """First parent's A with a blend of the parents' B (a crossover for loop tests only)."""
    from populora_core.api.lora import LoraFactors

    a, b = parents
    return a.with_modules(
        {
            n: LoraFactors(f.A, params.mix * f.B + (1 - params.mix) * b.modules[n].B, f.scale)
            for n, f in a.modules.items()
        }
    )


@hookimpl
def register_operators(register):
    register("test_noise", noise_mutation, params=NoiseParams, min_parents=1, max_parents=1)
    register("test_blend", b_blend, params=BlendParams, min_parents=2, max_parents=2)
