"""The ``nano`` base model: a tiny Llama trained here on synthetic AZR-style tasks (see README.md).

Recipes say ``base_model: nano``. The weights and tokenizer ship inside this package (``model/``);
``benchmarks/research/nano/make_model.py`` rebuilds them from a seed; ``probe.py`` reads the held-out ``probe.jsonl``.
No heavy imports here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from populora_core.api import Params, hookimpl

#: Plugins this one needs (nano_heldout grades with AZR's tasks); the import-rule test checks its imports.
PLUGIN_REQUIRES = ("populora_azr",)

#: Where the shipped model and probe set live.
MODEL_DIR = Path(__file__).resolve().parent / "model"
PROBE_FILE = Path(__file__).resolve().parent / "probe.jsonl"
#: ``populora eval``'s default on nano: its held-out problems (what it can score on) and 20 problems of each shipped
#: code benchmark (it scores 0 there, in seconds), minutes in all on a 2-core CPU; ``--benchmarks all``: the paper's.
EVAL_BENCHMARKS = ("nano_heldout", "humaneval:20", "mbpp:20")


class NanoParams(Params):
    """The shipped model has no knobs: it is one fixed set of weights."""


def nano_base_model(params: NanoParams | None = None) -> Any:
    """Tiny code-reasoning Llama trained on synthetic AZR tasks in the compact prompt style."""
    from populora_core.api.components import BaseModel
    from populora_core.api.errors import UserError

    if not (MODEL_DIR / "config.json").is_file():
        raise UserError(
            f"base_model nano: the model files are missing from {MODEL_DIR} "
            "(rebuild with: python -m benchmarks.research.nano.make_model --out plugins/populora_nano)"
        )
    return BaseModel(
        path=str(MODEL_DIR), name="nano", dtype="float32", probe_path=str(PROBE_FILE), eval_benchmarks=EVAL_BENCHMARKS
    )


@hookimpl
def register_base_models(register: Any) -> None:
    register(
        "nano",
        nano_base_model,
        params=NanoParams,
        description="tiny Llama (code tasks, compact prompts) shipped with PopuLoRA",
    )


@hookimpl
def register_evaluators(register: Any) -> None:
    from .heldout import HeldoutParams, NanoHeldout

    register(
        "nano_heldout",
        NanoHeldout,
        params=HeldoutParams,
        description="nano's held-out problems: 50 deduction, abduction and induction each, unseen in training",
        category="code",
    )
