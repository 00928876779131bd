"""One dense delta-W merge behind ``dare``, ``ties``, ``della`` (and the general ``delta_merge``).

Sparsifying merges are defined on dense delta W, so they cannot stay in factor space. Per module the
compiled kernel (:mod:`_merge_kernel`) rebuilds each parent's delta W row by row from its factors,
sparsifies, weights and combines the parents (plain sum, or TIES sign election + disjoint mean as
``peft.utils.merge_utils`` defines them) into one dense buffer, which is then refactored to rank r.
Peak memory: one module's delta W plus a few rows of scratch per thread.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from populora_core.adapters import LoraFactors, LoraWeights

from . import linalg as la
from .common import _refactored, _warn_zero_crossover, check_parents


def _row_sigma(b: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """RMS of each row of b @ a, from a a^T (exact, no dense rows)."""
    return (((b @ (a @ a.T)) * b).sum(1).clamp(min=0.0) / a.shape[1]).sqrt()


def _row_thresholds(p: Any, as_: list[torch.Tensor], bs: list[torch.Tensor]) -> torch.Tensor:
    """(k, d_out): the magnitude cut (magnitude) or the row RMS (della), under 'normal' ranking.

    Rows of a low-rank delta W are close to Gaussian, so the top-density cut of a row is its RMS times
    the normal quantile, and an entry's in-row magnitude rank is erf(|x| / (RMS sqrt 2)).
    """
    if p.ranking == "exact" or p.method == "random":
        return torch.zeros(len(bs), bs[0].shape[0])
    sigma = torch.stack([_row_sigma(b, a) for a, b in zip(as_, bs)])
    if p.method == "della":
        return sigma
    quantile = math.sqrt(2.0) * float(torch.erfinv(torch.tensor(1.0 - p.density, dtype=torch.float64)))
    return sigma * quantile


def dense_merge(
    fs: list[LoraFactors], weights: list[float], p: Any, generator: torch.Generator, buffer: torch.Tensor | None = None
) -> torch.Tensor:
    """The merged dense delta W of one module (sparsified, weighted, combined), before refactoring.

    ``buffer`` (flat fp32, at least d_out * d_in) is reused across modules: a fresh 271 MB buffer per
    7B MLP module costs ~0.1 s of page faults.
    """
    from . import _merge_kernel as kernel

    as_ = [f.A.float() for f in fs]
    bs = [f.B.float() * (f.scale * w) for f, w in zip(fs, weights)]  # weighted before sparsifying, as PEFT
    thr = _row_thresholds(p, as_, bs)
    seeds = torch.randint(0, 1 << 32, (len(fs),), generator=generator, dtype=torch.int64)
    shape = (bs[0].shape[0], as_[0].shape[1])
    out = torch.empty(shape) if buffer is None else buffer[: shape[0] * shape[1]].view(shape)
    with _numba_threads(torch.get_num_threads()):
        kernel.merge_rows(
            torch.stack(as_).numpy(),
            torch.stack(bs).numpy(),
            thr.float().contiguous().numpy(),
            seeds.numpy().astype("uint64"),
            out.numpy(),
            {"random": kernel.RANDOM, "magnitude": kernel.MAGNITUDE, "della": kernel.DELLA}[p.method],
            float(p.density),
            float(p.epsilon),
            bool(p.rescale),
            bool(p.sign_election),
            p.majority_sign_method == "frequency",
            p.ranking == "exact",
        )
    return out


class _numba_threads:
    """Run the kernel on as many threads as torch uses (one knob for the whole operator)."""

    def __init__(self, n: int) -> None:
        import numba

        self.numba, self.n = numba, max(1, min(n, numba.config.NUMBA_NUM_THREADS))

    def __enter__(self) -> None:
        self.before = self.numba.get_num_threads()
        self.numba.set_num_threads(self.n)

    def __exit__(self, *exc: object) -> None:
        self.numba.set_num_threads(self.before)


def _merge_module(
    fs: list[LoraFactors], weights: list[float], p: Any, gen: torch.Generator, buffer: torch.Tensor
) -> LoraFactors:
    rank = fs[0].A.shape[0]
    merged = dense_merge(fs, weights, p, gen, buffer)
    if p.refactor == "exact":
        u, s, vh = torch.linalg.svd(merged, full_matrices=False)
        u, s, vh = u[:, :rank], s[:rank], vh[:rank]
    else:
        probe, _ = torch.linalg.qr(torch.cat([f.A.float() for f in fs], dim=0).T)  # parents' row space: the signal
        u, s, vh = la.randomized_svd(merged, rank, gen, probe=probe, oversample=p.oversample, niter=p.niter)
    return _refactored(u, s, vh, fs[0], [f.A for f in fs], p)


def delta_merge(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """Sparsify each parent's delta W (random / magnitude / della), combine, refactor to rank r."""
    op = {"random": "dare", "magnitude": "ties", "della": "della"}[params.method]
    check_parents(parents, 0, op)
    _warn_zero_crossover(parents, op)
    k = len(parents)
    if params.weights is None:
        weights = [1.0] * k if params.sign_election else [1.0 / k] * k
    elif len(params.weights) != k:
        from populora_core.errors import UserError

        raise UserError(f"{op}: weights has {len(params.weights)} entries for {k} parents")
    else:
        weights = [float(w) for w in params.weights]
    buffer = torch.empty(max(f.B.shape[0] * f.A.shape[1] for f in parents[0].modules.values()))
    out = {}
    for name in parents[0].modules:
        out[name] = _merge_module([p.modules[name] for p in parents], weights, params, generator, buffer)
    return parents[0].with_modules(out)
