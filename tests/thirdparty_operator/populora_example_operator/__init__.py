"""Example third-party operator: ``scale_delta`` multiplies one parent's delta W by ``factor``.

It follows the operator contract of ``populora_core.plugin.hookspecs.register_operators``: a pure function
``op(parents, params, generator) -> LoraWeights`` that keeps rank, alpha and target modules. Scaling B
alone scales s * B @ A exactly (an operation on delta W, not on the factors' gauge); optional
``jitter`` draws from the generator it is given, so a seed reproduces the child.
"""

from __future__ import annotations

from pydantic import Field

from populora_core.api import Params, hookimpl


class ScaleDeltaParams(Params):
    """Shrink (factor < 1, a weight-decay-like step back towards the base) or grow delta W."""

    factor: float = Field(0.5, gt=0.0, description="delta W' = factor * delta W")
    jitter: float = Field(0.0, ge=0.0, description="Per-module log-normal spread of the factor.")


def scale_delta(parents, params, generator):  # type: ignore[no-untyped-def]
    """delta W' = factor * exp(jitter * z) * delta W per module (z ~ N(0, 1) from ``generator``)."""
    import torch  # heavy imports inside the function: `populora --help` stays fast

    from populora_core.api.lora import LoraFactors

    (parent,) = parents
    modules = {}
    for name, f in parent.items():
        z = float(torch.randn((), generator=generator)) if params.jitter else 0.0
        factor = params.factor * float(torch.exp(torch.tensor(params.jitter * z)))
        modules[name] = LoraFactors(f.A.clone(), (f.B.float() * factor).to(f.B.dtype), f.scale)
    return parent.with_modules(modules)


@hookimpl
def register_operators(register):  # type: ignore[no-untyped-def]
    register("scale_delta", scale_delta, params=ScaleDeltaParams, min_parents=1, max_parents=1)
