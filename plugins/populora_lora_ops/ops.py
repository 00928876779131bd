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

from populora_core.api.errors import UserError
from populora_core.api.lora import LoraFactors, LoraWeights

from . import linalg as la
from .merge import delta_merge
from .parents import (
    ZeroDeltaWarning,
    _copy,
    _is_zero,
    _refactored,
    _refactored_svd,
    _warn_zero_crossover,
    module_generators,
    rand,
    randn,
)

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
    parent = parents[0]
    names = list(parent.modules)
    zero = [n for n, z in zip(names, la.parallel_map(lambda n: _is_zero(parent.modules[n]), names)) if z]
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
            a = randn(tuple(a.shape), gen, a.device) / math.sqrt(a.shape[1])
        # entry variance of s * B @ A with B ~ N(0, c^2) is s^2 c^2 ||A||_F^2 / d_in
        c = params.floor_std * math.sqrt(a.shape[1]) / (f.scale * float(a.norm()))
        b = randn(tuple(f.B.shape), gen, f.B.device) * c
        modules[name] = LoraFactors(a.to(f.A.dtype), b.to(f.B.dtype), f.scale)
    return parent.with_modules(modules), set()


def _delta_std(f: LoraFactors) -> float:
    """std of the entries of s * B @ A, from r x r Gram matrices (no dense delta W)."""
    a, b = f.A.float(), f.B.float()
    n = b.shape[0] * a.shape[1]
    sumsq = f.scale**2 * float(((b.T @ b) * (a @ a.T)).sum())
    mean = f.scale * float(b.sum(0) @ a.sum(1)) / n
    return max(sumsq / n - mean * mean, 0.0) ** 0.5


def _with_lowrank_noise(fs: list[LoraFactors], eps: float, gen: torch.Generator, params: Any) -> list[LoraFactors]:
    """Per module, the best rank-r approximation of delta W + N, N = G1 G2 / sqrt(r) * eps * std(delta W).

    G1 G2 / sqrt(r) has unit-variance entries, so N is Gaussian-like noise of the stated std that
    stays low-rank; the exact rank-r truncation keeps the child's rank. G1 and G2 come from each
    module's own stream (:func:`module_generators`), drawn in parallel; the algebra then runs batched.
    """
    gens = module_generators(gen, len(fs))

    def noisy(i: int) -> list[la.Block]:
        f = fs[i]
        r = f.A.shape[0]
        g1 = randn((f.B.shape[0], r), gens[i], f.B.device)
        g2 = randn((r, f.A.shape[1]), gens[i], f.A.device)
        return [(f.B, f.A, f.scale), (g1, g2, eps * _delta_std(f) / math.sqrt(r))]

    stacks = la.parallel_map(noisy, list(range(len(fs))))
    svs = la.svds(stacks, [f.A.shape[0] for f in fs])
    return la.parallel_map(lambda i: _refactored_svd(svs[i], fs[i], [fs[i].A], params), list(range(len(fs))))


def _canonical(fs: list[LoraFactors]) -> list[la.FactoredSvd]:
    """Exact SVD of each module's delta W (batched Cholesky-QR, Householder where ill-conditioned)."""
    return la.svds([[(f.B, f.A, f.scale)] for f in fs], [f.A.shape[0] for f in fs])


# --- mutations ----------------------------------------------------------------------------------


def _mutate_modules(
    parents: list[LoraWeights],
    params: Any,
    generator: torch.Generator,
    op: str,
    mutate: Callable[[list[LoraFactors]], list[LoraFactors]],
    only: set[str] | None = None,
) -> LoraWeights:
    """``mutate`` the modules of the one parent (all, or those in ``only``) in one batch; the rest are copied.

    B = 0 modules get the noise floor first, or are copied unchanged under ``zero_delta: warn``.
    """
    parent, skip = _mutation_input(parents, params, generator, op)
    names = [n for n in parent.modules if n not in skip and (only is None or n in only)]
    mutated = dict(zip(names, mutate([parent.modules[n] for n in names]))) if names else {}
    kept = [name for name in parent.modules if name not in mutated]
    copies = dict(zip(kept, la.parallel_map(lambda name: _copy(parent.modules[name]), kept)))
    return parent.with_modules({name: mutated[name] if name in mutated else copies[name] for name in parent.modules})


@la.module_parallel
def svd_structured(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """M1: S' = S exp(sigma z) and a small rotation of U and V, on the exact SVD of delta W."""

    def mutate(fs: list[LoraFactors]) -> list[LoraFactors]:
        svs = _canonical(fs)
        gens = module_generators(generator, len(fs))

        def one(i: int) -> LoraFactors:
            sv, f, gen = svs[i], fs[i], gens[i]
            k = sv.s.shape[0]
            z = randn((k,), gen, sv.s.device)
            gu, gv = randn((f.B.shape[0], k), gen, f.B.device), randn((f.A.shape[1], k), gen, f.A.device)
            s = sv.s * torch.exp(params.sigma * z)
            u, vh = la.sign_fixed_pairs(sv.u(), sv.vh())  # the noise meets the same U, V on any backend
            u = la.rotated(u, gu, params.eps)
            v = la.rotated(vh.T, gv, params.eps)
            return _refactored(u, s, v.T, f, [f.A], params)

        return la.parallel_map(one, list(range(len(fs))))

    return _mutate_modules(parents, params, generator, "svd_structured", mutate)


@la.module_parallel
def layer_gaussian(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """M2: low-rank Gaussian noise of std eps * std(delta W) on a random fraction of the modules."""
    names = list(parents[0].modules)
    m = max(1, round(params.fraction * len(names)))
    chosen = {names[int(i)] for i in torch.randperm(len(names), generator=generator, device=generator.device)[:m]}
    return _mutate_modules(
        parents,
        params,
        generator,
        "layer_gaussian",
        lambda fs: _with_lowrank_noise(fs, params.eps, generator, params),
        chosen,
    )


@la.module_parallel
def gaussian(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """M4: low-rank Gaussian noise of std eps * std(delta W) on every module."""
    return _mutate_modules(
        parents, params, generator, "gaussian", lambda fs: _with_lowrank_noise(fs, params.eps, generator, params)
    )


@la.module_parallel
def component_mask(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """M3: zero ceil(rho r) singular values of delta W (their A rows stay, so they can regrow)."""

    def mutate(fs: list[LoraFactors]) -> list[LoraFactors]:
        svs = _canonical(fs)
        masked = []
        for f, sv in zip(fs, svs):
            k = sv.s.shape[0]
            m = min(max(math.ceil(params.rho * f.A.shape[0]), 1), max(k - 1, 1))
            if params.which == "random":
                idx = torch.randperm(k, generator=generator, device=generator.device)[:m]
            elif params.which == "smallest":
                idx = torch.arange(k - m, k)
            else:
                idx = torch.arange(m)
            s = sv.s.clone()
            s[idx.to(s.device)] = 0.0
            masked.append(sv.with_s(s))
        return la.parallel_map(lambda i: _refactored_svd(masked[i], fs[i], [fs[i].A], params), list(range(len(fs))))

    return _mutate_modules(parents, params, generator, "component_mask", mutate)


@la.module_parallel
def neftune(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """M5: uniform noise in [-b, b], b = alpha / sqrt(d_in r), on the down factor A only."""

    def mutate(fs: list[LoraFactors]) -> list[LoraFactors]:
        gens = module_generators(generator, len(fs))

        def one(i: int) -> LoraFactors:
            f = fs[i]
            r, d_in = f.A.shape
            bound = params.alpha / math.sqrt(d_in * r)
            a = rand((r, d_in), gens[i], f.A.device).mul_(2.0 * bound).sub_(bound).add_(f.A)  # A + U(-b, b)
            return LoraFactors(a.to(f.A.dtype), f.B.clone(), f.scale)

        return la.parallel_map(one, list(range(len(fs))))

    return _mutate_modules(parents, params, generator, "neftune", mutate)


# --- crossovers ---------------------------------------------------------------------------------


def _weights(params_weights: list[float] | None, k: int, op: str) -> list[float]:
    if params_weights is None:
        return [1.0 / k] * k
    if len(params_weights) != k:
        raise UserError(f"{op}: weights has {len(params_weights)} entries for {k} parents")
    return [float(w) for w in params_weights]


def weighted_lowrank(parents: list[LoraWeights], weights: list[float], params: Any) -> LoraWeights:
    """Per module, the exact best rank-r approximation of sum_i w_i delta W_i (all modules batched)."""
    names = list(parents[0].modules)
    fss = [[p.modules[n] for p in parents] for n in names]
    svs = la.svds(
        [[(g.B, g.A, w * g.scale) for g, w in zip(fs, weights)] for fs in fss], [fs[0].A.shape[0] for fs in fss]
    )
    out = la.parallel_map(
        lambda i: _refactored_svd(svs[i], fss[i][0], [g.A for g in fss[i]], params), list(range(len(names)))
    )
    return parents[0].with_modules(dict(zip(names, out)))


@la.module_parallel
def svd_crossover(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """Exact best rank-r approximation of the weighted sum of the parents' delta W."""
    _warn_zero_crossover(parents, "svd")
    return weighted_lowrank(parents, _weights(params.weights, len(parents), "svd"), params)


@la.module_parallel
def extrapolate(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """X4: worse + eta (better - worse), eta ~ U(eta_low, eta_high); parents = [better, worse]."""
    _warn_zero_crossover(parents, "extrapolate")
    eta = params.eta_low + (params.eta_high - params.eta_low) * float(
        torch.rand((), generator=generator, device=generator.device)
    )
    return weighted_lowrank(parents, [eta, 1.0 - eta], params)


@la.module_parallel
def xes(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """X5: mean + step * sum_i z_i (delta W_i - mean) / k, z the parents' fitness z-scores."""
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


@la.module_parallel
def svd_subspace(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """X3: top-k singular triplets of parent 1's delta W plus the top r - k of parent 2's."""
    _warn_zero_crossover(parents, "svd_subspace")
    names = list(parents[0].modules)
    fss = [(parents[0].modules[n], parents[1].modules[n]) for n in names]
    canon = _canonical([f for pair in fss for f in pair])

    def taken(i: int) -> list[la.Block]:
        r = fss[i][0].A.shape[0]
        k = min(max(round(params.k_frac * r), 1), r - 1) if r > 1 else 1
        first, second = canon[2 * i].top(k), canon[2 * i + 1].top(r - k)
        return [(first.u(first.s), first.vh(), 1.0), (second.u(second.s), second.vh(), 1.0)]

    stacks = la.parallel_map(taken, list(range(len(names))))
    svs = la.svds(stacks, [f.A.shape[0] for f, _ in fss])
    out = la.parallel_map(
        lambda i: _refactored_svd(svs[i], fss[i][0], [fss[i][0].A, fss[i][1].A], params), list(range(len(names)))
    )
    return parents[0].with_modules(dict(zip(names, out)))


def _unit(name: str, granularity: str) -> str:
    if granularity == "layer":
        m = re.search(r"\.(\d+)\.", name)
        if m:
            return m.group(1)
    return name


@la.module_parallel
def layerwise(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """X2: each module's (or layer's) factors copied unchanged from one parent; each parent used."""
    k = len(parents)
    units = list(dict.fromkeys(_unit(n, params.granularity) for n in parents[0].modules))
    if len(units) < k:
        raise UserError(f"layerwise: {len(units)} {params.granularity}(s) cannot take from {k} parents")
    n = len(units)
    if k == 2:
        choice = (torch.rand(n, generator=generator, device=generator.device) >= params.p).long().cpu()
    else:
        choice = torch.randint(0, k, (n,), generator=generator, device=generator.device).cpu()
    for j in range(k):  # every parent contributes, or the child would be a clone
        if bool((choice == j).any()):
            continue
        counts = torch.bincount(choice, minlength=k)
        donors = [i for i in range(n) if int(counts[choice[i]]) > 1]
        choice[donors[int(torch.randint(0, len(donors), (1,), generator=generator, device=generator.device))]] = j
    pick = {u: int(c) for u, c in zip(units, choice)}
    return parents[0].with_modules(
        {name: _copy(parents[pick[_unit(name, params.granularity)]].modules[name]) for name in parents[0].modules}
    )


@la.module_parallel
def clone(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """X6: an exact copy (the child is a new member; mutate it for exploit-and-explore PBT)."""
    return parents[0].with_modules({name: _copy(f) for name, f in parents[0].items()})
