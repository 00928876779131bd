"""The one checked way to make a child: :func:`apply_operator`, used by the loop and by ``populora evolve``.

It checks the parents' count against the operator's declared arity (:func:`populora_core.api.operators.operator_arity`)
and their shapes against each other, runs the operator with a seeded torch generator, and checks that the child has
the parents' rank, alpha, target modules and shapes before anything saves it. torch is imported inside functions only.
"""

from __future__ import annotations

from typing import Any

from ..api.errors import PluginError, UserError
from ..api.lora import LoraWeights
from ..api.operators import arity_text, operator_arity
from ..api.params import Component, Params
from .adapters import check_compatible, shape_difference


def apply_operator(component: Component, params: Params, parents: list[LoraWeights], seed: int) -> LoraWeights:
    """One child of ``parents`` (best first) by ``component``, checked before anyone saves it."""
    import torch

    low, high = operator_arity(component)
    if len(parents) < low or (high is not None and len(parents) > high):
        raise UserError(
            f"operator {component.name!r} (plugin {component.plugin}) takes {arity_text(component)} parent(s), "
            f"got {len(parents)} (registered with min_parents={low}, max_parents={high})"
        )
    check_compatible(parents)
    child = component.factory(parents, params, torch.Generator().manual_seed(int(seed)))
    check_child(component, parents[0], child)
    return child


def check_child(component: Component, parent: LoraWeights, child: Any) -> None:
    """A child keeps its parents' rank, alpha, target modules and every module's shapes."""
    where = f"operator {component.name!r} (plugin {component.plugin})"
    if not isinstance(child, LoraWeights):
        raise PluginError(f"{where} returned {type(child).__name__}, not LoraWeights")
    diff = shape_difference(parent, child, arrow="->")
    if diff is not None:
        raise PluginError(f"{where} changed {diff}")
