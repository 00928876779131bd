"""PopuLoRA evaluators: the paper's ten benchmarks (plus base HumanEval/MBPP) and ``populora eval``.

Registers one evaluator per benchmark (``register_evaluators``) and the ``eval`` command
(``register_commands``). Nothing heavy is imported here: data, math-verify, matplotlib and the
engines load only when an evaluation runs. See README.md for data sources (local file, shipped
package, pinned hub dataset) and file formats.
"""

from __future__ import annotations

from typing import Any

from populora_core.api import hookimpl


@hookimpl
def register_evaluators(register: Any) -> None:
    from .evaluators import BENCHMARKS, EvaluatorParams, make_factory

    for name, cls in BENCHMARKS.items():
        register(
            name,
            make_factory(cls),
            params=EvaluatorParams,
            description=f"{name} ({cls.category}; data: {cls.sources()})",
            category=cls.category,
        )


@hookimpl
def register_commands(cli: Any) -> None:
    from .cli import register

    register(cli)
