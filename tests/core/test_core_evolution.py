"""apply_operator: the one checked way to make a child (arity from metadata, compatible parents, child checked)."""

from __future__ import annotations

import pytest
import torch

from populora_core import PluginError, UserError
from populora_core.api.lora import LoraFactors, LoraWeights
from populora_core.api.operators import operator_arity
from populora_core.api.params import Component, NoParams
from populora_core.services.operators import apply_operator


def _weights(rank: int = 2, alpha: float = 4.0, d: int = 6, seed: int = 0) -> LoraWeights:
    g = torch.Generator().manual_seed(seed)
    modules = {
        f"base_model.model.layers.0.{m}": LoraFactors(
            torch.randn(rank, d, generator=g), torch.randn(d, rank, generator=g), alpha / rank
        )
        for m in ("q_proj", "v_proj")
    }
    return LoraWeights(modules, {"r": rank, "lora_alpha": alpha, "target_modules": ["q_proj", "v_proj"]})


def _operator(fn, **meta) -> Component:
    return Component("operator", "op", fn, NoParams, "test-plugin", "1", meta=meta)


def identity(parents, params, generator):
    return parents[0].with_modules(dict(parents[0].modules))


def test_arity_comes_from_min_and_max_parents_and_must_be_declared():
    assert operator_arity(_operator(identity, min_parents=1, max_parents=1)) == (1, 1)
    assert operator_arity(_operator(identity, min_parents=2, max_parents=None)) == (2, None)
    assert operator_arity(_operator(identity, min_parents=2)) == (2, None)
    with pytest.raises(PluginError, match="does not declare how many parents"):
        operator_arity(_operator(identity))
    with pytest.raises(PluginError, match="bad arity"):
        operator_arity(_operator(identity, min_parents=3, max_parents=2))


def test_parent_count_and_compatibility_are_checked_before_the_operator_runs():
    calls = []

    def counting(parents, params, generator):
        calls.append(len(parents))
        return identity(parents, params, generator)

    mutation = _operator(counting, min_parents=1, max_parents=1)
    with pytest.raises(UserError, match="takes exactly 1 parent"):
        apply_operator(mutation, NoParams(), [_weights(), _weights(seed=1)], seed=0)
    crossover = _operator(counting, min_parents=2, max_parents=None)
    with pytest.raises(UserError, match="takes 2 or more parent"):
        apply_operator(crossover, NoParams(), [_weights()], seed=0)
    with pytest.raises(UserError, match="differ in r"):
        apply_operator(crossover, NoParams(), [_weights(), _weights(rank=3)], seed=0)
    other_targets = LoraWeights(_weights().modules, {**_weights().config, "target_modules": ["q_proj"]})
    with pytest.raises(UserError, match="differ in target_modules"):  # the child check's keys (SHAPE_KEYS)
        apply_operator(crossover, NoParams(), [_weights(), other_targets], seed=0)
    assert calls == []
    child = apply_operator(crossover, NoParams(), [_weights(), _weights(seed=1), _weights(seed=2)], seed=0)
    assert calls == [3] and child.rank == 2


@pytest.mark.parametrize(
    "breaks,message",
    [
        (lambda w: w.modules, "returned dict, not LoraWeights"),
        (lambda w: LoraWeights(w.modules, {**w.config, "r": 4}), "changed r: 2 -> 4"),
        (lambda w: LoraWeights(w.modules, {**w.config, "lora_alpha": 8.0}), "changed lora_alpha: 4.0 -> 8.0"),
        (lambda w: LoraWeights(w.modules, {**w.config, "target_modules": ["q_proj"]}), "target_modules"),
        (lambda w: w.with_modules(dict(list(w.modules.items())[:1])), "changed the set of target modules"),
        (
            lambda w: w.with_modules({n: LoraFactors(f.A[:1], f.B[:, :1], f.scale) for n, f in w.modules.items()}),
            "changed the shape of",
        ),
    ],
)
def test_a_child_that_changes_the_adapters_shape_is_refused(breaks, message):
    op = _operator(lambda parents, params, generator: breaks(parents[0]), min_parents=1, max_parents=1)
    with pytest.raises(PluginError, match=message) as err:
        apply_operator(op, NoParams(), [_weights()], seed=0)
    assert "plugin test-plugin" in str(err.value)
