"""The operators: pure functions ``op(parents, params, generator) -> LoraWeights``.

Every operator works per target module on delta W = s * B @ A (never on factors element-wise, which
is not an operation on delta W), in fp32, and returns factors of the parents' rank, scale and dtype.
Randomness comes only from ``generator``, so one seed gives byte-identical children.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from typing import Any

import torch

from populora_core.adapters import LoraFactors, LoraWeights
from populora_core.errors import UserError

from . import linalg as la
from .common import ZeroDeltaWarning, _copy, _is_zero, _refactored, _warn_zero_crossover, check_parents
from .merge import delta_merge

__all__ = [
    "ZeroDeltaWarning",
    "clone",
    "component_mask",
    "delta_merge",
    "extrapolate",
    "gaussian",
    "layer_gaussian",
    "layerwise",
    "neftune",
    "svd_crossover",
    "svd_structured",
    "svd_subspace",
    "xes",
]


def _mutation_input(
    parents: list[LoraWeights], params: Any, gen: torch.Generator, op: str
) -> tuple[LoraWeights, set[str]]:
    """The parent, with B = 0 modules given a noise floor (``floor``) or listed to skip (``warn``)."""
    check_parents(parents, 1, op)
    parent = parents[0]
    zero = [name for name, f in parent.items() if _is_zero(f)]
    if not zero:
        return parent, set()
    if params.zero_delta == "warn":
        warnings.warn(
            f"{op}: {len(zero)} of {len(parent.modules)} modules have B = 0 (an untrained "
            "adapter), so this mutation leaves them unchanged; zero_delta=floor adds a noise "
            "floor first",
            ZeroDeltaWarning,
            stacklevel=3,
        )
        return parent, set(zero)
    modules = dict(parent.modules)
    for name in zero:
        f = modules[name]
        a = f.A.float()
        if not torch.any(a):
            a = torch.randn(a.shape, generator=gen) / math.sqrt(a.shape[1])
        # entry variance of s * B @ A with B ~ N(0, c^2) is s^2 c^2 ||A||_F^2 / d_in
        c = params.floor_std * math.sqrt(a.shape[1]) / (f.scale * float(a.norm()))
        b = torch.randn(f.B.shape, generator=gen) * c
        modules[name] = LoraFactors(a.to(f.A.dtype), b.to(f.B.dtype), f.scale)
    return parent.with_modules(modules), set()


def _delta_std(f: LoraFactors) -> float:
    """std of the entries of s * B @ A, from r x r Gram matrices (no dense delta W)."""
    a, b = f.A.float(), f.B.float()
    n = b.shape[0] * a.shape[1]
    sumsq = f.scale**2 * float(((b.T @ b) * (a @ a.T)).sum())
    mean = f.scale * float(b.sum(0) @ a.sum(1)) / n
    return max(sumsq / n - mean * mean, 0.0) ** 0.5


def _with_lowrank_noise(f: LoraFactors, eps: float, gen: torch.Generator, params: Any) -> LoraFactors:
    """Best rank-r approximation of delta W + N, N = G1 G2 / sqrt(r) * eps * std(delta W).

    G1 G2 / sqrt(r) has unit-variance entries, so N is Gaussian-like noise of the stated std that
    stays low-rank; the exact rank-r truncation keeps the child's rank.
    """
    r = f.A.shape[0]
    sigma = eps * _delta_std(f) / math.sqrt(r)
    g1 = torch.randn(f.B.shape[0], r, generator=gen)
    g2 = torch.randn(r, f.A.shape[1], generator=gen)
    u, s, vh = la.best_rank(
        torch.cat([f.scale * f.B.float(), sigma * g1], dim=1), torch.cat([f.A.float(), g2], dim=0), r
    )
    return _refactored(u, s, vh, f, [f.A], params)


# --- mutations ----------------------------------------------------------------------------------


def _mutate_modules(
    parents: list[LoraWeights],
    params: Any,
    generator: torch.Generator,
    op: str,
    mutate: Callable[[LoraFactors], LoraFactors],
    only: set[str] | None = None,
) -> LoraWeights:
    """``mutate`` every module of the one parent (or those in ``only``); the rest are copied.

    B = 0 modules get the noise floor first, or are copied unchanged under ``zero_delta: warn``.
    """
    parent, skip = _mutation_input(parents, params, generator, op)
    return parent.with_modules(
        {
            name: mutate(f) if name not in skip and (only is None or name in only) else _copy(f)
            for name, f in parent.items()
        }
    )


def svd_structured(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """M1: S' = S exp(sigma z) and a small rotation of U and V, on the exact SVD of delta W."""

    def mutate(f: LoraFactors) -> LoraFactors:
        u, s, vh = la.canonical(f.A, f.B, f.scale)
        s = s * torch.exp(params.sigma * torch.randn(s.shape, generator=generator))
        u = la.rotate(u, params.eps, generator)
        v = la.rotate(vh.T, params.eps, generator)
        return _refactored(u, s, v.T, f, [f.A], params)

    return _mutate_modules(parents, params, generator, "svd_structured", mutate)


def layer_gaussian(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """M2: low-rank Gaussian noise of std eps * std(delta W) on a random fraction of the modules."""
    check_parents(parents, 1, "layer_gaussian")
    names = list(parents[0].modules)
    m = max(1, round(params.fraction * len(names)))
    chosen = {names[int(i)] for i in torch.randperm(len(names), generator=generator)[:m]}
    return _mutate_modules(
        parents,
        params,
        generator,
        "layer_gaussian",
        lambda f: _with_lowrank_noise(f, params.eps, generator, params),
        chosen,
    )


def gaussian(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """M4: low-rank Gaussian noise of std eps * std(delta W) on every module."""
    return _mutate_modules(
        parents, params, generator, "gaussian", lambda f: _with_lowrank_noise(f, params.eps, generator, params)
    )


def component_mask(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """M3: zero ceil(rho r) singular values of delta W (their A rows stay, so they can regrow)."""

    def mutate(f: LoraFactors) -> LoraFactors:
        u, s, vh = la.canonical(f.A, f.B, f.scale)
        k = s.shape[0]
        m = min(max(math.ceil(params.rho * f.A.shape[0]), 1), max(k - 1, 1))
        if params.which == "random":
            idx = torch.randperm(k, generator=generator)[:m]
        elif params.which == "smallest":
            idx = torch.arange(k - m, k)
        else:
            idx = torch.arange(m)
        s = s.clone()
        s[idx] = 0.0
        return _refactored(u, s, vh, f, [f.A], params)

    return _mutate_modules(parents, params, generator, "component_mask", mutate)


def neftune(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """M5: uniform noise in [-b, b], b = alpha / sqrt(d_in r), on the down factor A only."""

    def mutate(f: LoraFactors) -> LoraFactors:
        r, d_in = f.A.shape
        bound = params.alpha / math.sqrt(d_in * r)
        noise = (torch.rand(f.A.shape, generator=generator) * 2.0 - 1.0) * bound
        return LoraFactors((f.A.float() + noise).to(f.A.dtype), f.B.clone(), f.scale)

    return _mutate_modules(parents, params, generator, "neftune", mutate)


# --- crossovers ---------------------------------------------------------------------------------


def _weights(params_weights: list[float] | None, k: int, op: str) -> list[float]:
    if params_weights is None:
        return [1.0 / k] * k
    if len(params_weights) != k:
        raise UserError(f"{op}: weights has {len(params_weights)} entries for {k} parents")
    return [float(w) for w in params_weights]


def weighted_lowrank(parents: list[LoraWeights], weights: list[float], params: Any) -> LoraWeights:
    """Per module, the exact best rank-r approximation of sum_i w_i delta W_i."""
    out = {}
    for name, f in parents[0].items():
        fs = [p.modules[name] for p in parents]
        u, s, vh = la.weighted_best_rank([(g.A, g.B, g.scale) for g in fs], weights, f.A.shape[0])
        out[name] = _refactored(u, s, vh, f, [g.A for g in fs], params)
    return parents[0].with_modules(out)


def svd_crossover(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """Exact best rank-r approximation of the weighted sum of the parents' delta W."""
    check_parents(parents, 0, "svd")
    _warn_zero_crossover(parents, "svd")
    return weighted_lowrank(parents, _weights(params.weights, len(parents), "svd"), params)


def extrapolate(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """X4: worse + eta (better - worse), eta ~ U(eta_low, eta_high); parents = [better, worse]."""
    check_parents(parents, 2, "extrapolate")
    _warn_zero_crossover(parents, "extrapolate")
    eta = params.eta_low + (params.eta_high - params.eta_low) * float(torch.rand((), generator=generator))
    return weighted_lowrank(parents, [eta, 1.0 - eta], params)


def xes(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """X5: mean + step * sum_i z_i (delta W_i - mean) / k, z the parents' fitness z-scores."""
    check_parents(parents, 0, "xes")
    _warn_zero_crossover(parents, "xes")
    k = len(parents)
    fitness = params.fitness if params.fitness is not None else [float(k - i) for i in range(k)]
    if len(fitness) != k:
        raise UserError(f"xes: fitness has {len(fitness)} entries for {k} parents")
    f = torch.tensor(fitness, dtype=torch.float64)
    std = float(f.std(unbiased=False))
    z = (f - f.mean()) / std if std > 0 else torch.zeros_like(f)
    weights = [1.0 / k + params.step * float(zi) / k for zi in z]
    return weighted_lowrank(parents, weights, params)


def svd_subspace(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """X3: top-k singular triplets of parent 1's delta W plus the top r - k of parent 2's."""
    check_parents(parents, 2, "svd_subspace")
    _warn_zero_crossover(parents, "svd_subspace")
    out = {}
    for name, f in parents[0].items():
        g = parents[1].modules[name]
        r = f.A.shape[0]
        k = min(max(round(params.k_frac * r), 1), r - 1) if r > 1 else 1
        u1, s1, vh1 = la.canonical(f.A, f.B, f.scale)
        u2, s2, vh2 = la.canonical(g.A, g.B, g.scale)
        bs = torch.cat([u1[:, :k] * s1[:k], u2[:, : r - k] * s2[: r - k]], dim=1)
        as_ = torch.cat([vh1[:k], vh2[: r - k]], dim=0)
        u, s, vh = la.best_rank(bs, as_, r)
        out[name] = _refactored(u, s, vh, f, [f.A, g.A], params)
    return parents[0].with_modules(out)


def _unit(name: str, granularity: str) -> str:
    if granularity == "layer":
        m = re.search(r"\.(\d+)\.", name)
        if m:
            return m.group(1)
    return name


def layerwise(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """X2: each module's (or layer's) factors copied unchanged from one parent; each parent used."""
    check_parents(parents, 0, "layerwise")
    k = len(parents)
    units = list(dict.fromkeys(_unit(n, params.granularity) for n in parents[0].modules))
    if len(units) < k:
        raise UserError(f"layerwise: {len(units)} {params.granularity}(s) cannot take from {k} parents")
    n = len(units)
    if k == 2:
        choice = (torch.rand(n, generator=generator) >= params.p).long()
    else:
        choice = torch.randint(0, k, (n,), generator=generator)
    for j in range(k):  # every parent contributes, or the child would be a clone
        if bool((choice == j).any()):
            continue
        counts = torch.bincount(choice, minlength=k)
        donors = [i for i in range(n) if int(counts[choice[i]]) > 1]
        choice[donors[int(torch.randint(0, len(donors), (1,), generator=generator))]] = j
    pick = {u: int(c) for u, c in zip(units, choice)}
    return parents[0].with_modules(
        {name: _copy(parents[pick[_unit(name, params.granularity)]].modules[name]) for name in parents[0].modules}
    )


def clone(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """X6: an exact copy (the child is a new member; mutate it for exploit-and-explore PBT)."""
    check_parents(parents, 1, "clone")
    return parents[0].with_modules({name: _copy(f) for name, f in parents[0].items()})
