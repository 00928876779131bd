"""The arithmetic world: a task and a tiny base in which self-play has something to teach (see README.md).

Teachers write addition questions ``a+b`` whose difficulty (the level: digits of the longer operand, 1-6) they
control by what they write; students answer least significant digit first. ``arith_nano``, the base, was trained
here to be capable at the low levels, partly capable at the middle ones and incapable at the top ones
(``benchmarks/research/arith/make_model.py``). Recipes: ``recipes/arith.yaml`` (4 teachers, 4 students) and
``recipes/arith_single_agent.yaml``. No heavy imports here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from populora_core.api import Params, hookimpl

from . import world

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE / "model"
PROBE_FILE = HERE / "probe.jsonl"
HELDOUT_FILE = HERE / "heldout.jsonl"
#: ``populora eval``'s default on arith_nano: its held-out problems of every level.
EVAL_BENCHMARKS = ("arith_heldout",)


class ArithParams(Params):
    """Rewards (AZR's by default), the seed buffer and the references a teacher is shown."""

    references: int = Field(3, ge=1, le=8, description="a proposer prompt shows 1 to this many buffer questions")
    seed_levels: tuple[int, ...] = Field(
        (1, 2, 3), description="levels of the seed buffer's questions (what teachers are first shown)"
    )
    seed_per_level: int = Field(4, ge=1, description="seed questions per level in seed_levels")
    solver_correct: float = Field(1.0, description="student reward for the right answer")
    solver_wrong: float = Field(-0.5, description="student reward for digits that are not the answer")
    solver_format: float = Field(-1.0, description="student reward for an answer that is not digits")
    unsolved_reward: float = Field(-0.5, description="teacher reward when the matched student never solves it")
    solved_reward: float = Field(-0.5, description="teacher reward when the matched student always solves it")
    invalid_reward: float = Field(-1.0, description="teacher reward for a question outside the grammar")

    def model_post_init(self, context: Any) -> None:
        bad = [lv for lv in self.seed_levels if lv not in world.LEVELS]
        if bad:
            raise ValueError(f"seed_levels {bad} outside levels {world.LEVELS[0]}-{world.LEVELS[-1]}")


class ArithBaseParams(Params):
    """The shipped model has no knobs: it is one fixed set of weights."""


def _arith(params: ArithParams, *, rng: Any) -> Any:
    """Addition questions with levels (digits); exact answers written least significant digit first."""
    from .task import ArithTask

    return ArithTask(params, rng)


def arith_base_model(params: ArithBaseParams | None = None) -> Any:
    """Tiny Llama trained on the arithmetic world: solves the low levels, some of the middle ones, none on top."""
    from populora_core.api.components import BaseModel
    from populora_core.api.errors import UserError

    if not (MODEL_DIR / "config.json").is_file():
        raise UserError(
            f"base_model arith_nano: the model files are missing from {MODEL_DIR} "
            "(rebuild with: python -m benchmarks.research.arith.make_model, see plugins/populora_arith/README.md)"
        )
    return BaseModel(
        path=str(MODEL_DIR),
        name="arith_nano",
        dtype="float32",
        probe_path=str(PROBE_FILE),
        eval_benchmarks=EVAL_BENCHMARKS,
    )


@hookimpl
def register_tasks(register: Any) -> None:
    register("arith", _arith, params=ArithParams)


@hookimpl
def register_base_models(register: Any) -> None:
    register(
        "arith_nano",
        arith_base_model,
        params=ArithBaseParams,
        description="tiny Llama of the arithmetic world (addition by levels) shipped with PopuLoRA",
    )


@hookimpl
def register_evaluators(register: Any) -> None:
    from .heldout import ArithHeldout, HeldoutParams

    register(
        "arith_heldout",
        ArithHeldout,
        params=HeldoutParams,
        description="the arithmetic world's held-out problems: every level, unseen by the base and the probe",
        category="math",
    )
