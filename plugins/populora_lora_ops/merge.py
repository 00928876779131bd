"""One streamed delta-W merge behind ``dare``, ``ties``, ``della`` (and the general ``delta_merge``).

Sparsifying merges are defined on dense delta W, so they cannot stay in factor space. Per module we
build each parent's delta W one cache-sized block of rows at a time, sparsify it, weight it, combine
the parents (plain sum, or TIES sign election + disjoint mean via ``peft.utils.merge_utils``), write
the block into one dense buffer and already multiply it by the randomized SVD's probe matrix. The
buffer is then refactored to rank r. Peak memory: one module's delta W plus O(block) scratch.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from populora_core.adapters import LoraFactors, LoraWeights

from . import _kernels
from . import linalg as la
from .common import _refactored, _warn_zero_crossover, check_parents

_U15 = 1 << 15  # keep decisions compare 15 random bits: probabilities are quantised to 1/32768


def _uniform15(n: int, gen: torch.Generator) -> torch.Tensor:
    """n integers uniform in [0, 32768), four per 64-bit draw (4x faster than torch.rand)."""
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(generator=gen)
    return words.view(torch.int16)[:n] & 0x7FFF


def _row_sigma(b_rows: torch.Tensor, gram: torch.Tensor, d_in: int) -> torch.Tensor:
    """RMS of each row of b_rows @ A, from A A^T (exact, no dense rows)."""
    return (((b_rows @ gram) * b_rows).sum(1).clamp(min=0.0) / d_in).sqrt()


def _sparsify(x: torch.Tensor, p: Any, gen: torch.Generator, b_rows: torch.Tensor,
              gram: torch.Tensor | None) -> torch.Tensor:
    """Drop entries of one block of delta W in place as ``p.method`` says; rescale kept ones."""
    d_in = x.shape[1]
    if p.method == "random":
        t = max(1, round(p.density * _U15))
        if t < _U15:  # (a python int >= 2^15 would wrap when compared with int16)
            x.mul_(_uniform15(x.numel(), gen).view(x.shape) < t)
        if p.rescale:
            x.mul_(_U15 / t)
        return x
    mag = x.abs()
    if p.method == "magnitude":
        if p.ranking == "exact":
            m = max(1, math.ceil(p.density * d_in))
            thr = torch.kthvalue(mag, d_in - m + 1, dim=1).values
        else:
            assert gram is not None
            thr = _row_sigma(b_rows, gram, d_in) * (math.sqrt(2.0) * float(torch.erfinv(
                torch.tensor(1.0 - p.density, dtype=torch.float64))))
        x.mul_(mag >= thr[:, None])
        if p.rescale:
            x.mul_(1.0 / p.density)
        return x
    # della: keep-probability linear in the in-row magnitude rank, in [density - eps, density + eps]
    if p.ranking == "exact":
        order = torch.argsort(mag, dim=1)
        ranks = torch.empty_like(mag)
        ranks.scatter_(1, order, torch.arange(d_in, dtype=mag.dtype).expand_as(mag).contiguous())
        frac = ranks.mul_(1.0 / max(d_in - 1, 1))
    else:
        assert gram is not None
        sigma = _row_sigma(b_rows, gram, d_in).clamp(min=1e-30)
        frac = torch.erf(mag.div_((sigma * math.sqrt(2.0))[:, None]))  # P(|N(0, sigma)| < |x|)
    prob = frac.mul_(2.0 * p.epsilon).add_(p.density - p.epsilon)
    keep = _uniform15(x.numel(), gen).view(x.shape) < prob * _U15
    x.mul_(keep)
    if p.rescale:
        x.div_(prob)
    return x


def _thresholds(p: Any, x: torch.Tensor, b_rows: torch.Tensor, gram: torch.Tensor | None) -> torch.Tensor:
    """Per row: the magnitude cut (magnitude) or the row RMS (della, normal ranking)."""
    d_in = x.shape[1]
    if p.method == "magnitude":
        if p.ranking == "exact":
            m = max(1, math.ceil(p.density * d_in))
            return torch.kthvalue(x.abs(), d_in - m + 1, dim=1).values
        assert gram is not None
        return _row_sigma(b_rows, gram, d_in) * (math.sqrt(2.0) * float(torch.erfinv(
            torch.tensor(1.0 - p.density, dtype=torch.float64))))
    if p.method == "della" and p.ranking == "normal":
        assert gram is not None
        return _row_sigma(b_rows, gram, d_in)
    return x.new_zeros(1)


def _exact_rank_frac(x: torch.Tensor) -> torch.Tensor:
    mag = x.abs()
    order = torch.argsort(mag, dim=1)
    ranks = torch.empty_like(mag)
    ranks.scatter_(1, order, torch.arange(x.shape[1], dtype=mag.dtype).expand_as(mag).contiguous())
    return ranks.mul_(1.0 / max(x.shape[1] - 1, 1))


def _fused_block(stack: torch.Tensor, bs: list[torch.Tensor], grams: list[Any], r0: int, r1: int, p: Any,
                 gen: torch.Generator, out: torch.Tensor, kernel: Any) -> None:
    """Sparsify + combine one row block in one numba pass; the same random bits as the torch path."""
    k, rows, d_in = stack.shape
    n = rows * d_in
    bits = (torch.stack([_uniform15(n, gen).view(rows, d_in) for _ in range(k)]) if p.method != "magnitude"
            else torch.zeros(1, 1, 1, dtype=torch.int16))
    if p.method == "della" and p.ranking == "exact":
        thr = torch.zeros(1, 1)
        frac = torch.stack([_exact_rank_frac(stack[i]) for i in range(k)])
    else:
        thr = torch.stack([_thresholds(p, stack[i], bs[i][r0:r1], grams[i]).expand(rows) for i in range(k)])
        frac = torch.zeros(1, 1, 1)
    t = max(1, round(p.density * _U15))
    kernel(stack.numpy(), bits.numpy(), thr.contiguous().numpy(), frac.numpy(), out.numpy(),
           _kernels.METHODS[p.method], t, float(p.density), float(p.epsilon), bool(p.rescale),
           bool(p.sign_election), p.majority_sign_method == "frequency", p.method == "della" and p.ranking == "exact")


def _merge_module(fs: list[LoraFactors], weights: list[float], p: Any, gen: torch.Generator,
                  use_kernel: bool | None = None) -> LoraFactors:
    from peft.utils.merge_utils import calculate_majority_sign_mask, disjoint_merge

    rank = fs[0].A.shape[0]
    d_out, d_in = fs[0].B.shape[0], fs[0].A.shape[1]
    as_ = [f.A.float() for f in fs]
    bs = [f.B.float() * (f.scale * w) for f, w in zip(fs, weights)]  # weighted before sparsifying, as PEFT
    grams = [a @ a.T for a in as_] if p.ranking == "normal" and p.method != "random" else [None] * len(fs)
    omega = None
    if p.refactor == "randomized":
        probe, _ = torch.linalg.qr(torch.cat(as_, dim=0).T)  # the parents' row space carries the signal
        omega = la.probe_matrix(d_in, rank, gen, probe=probe, oversample=p.oversample,
                                limit=min(d_out, d_in))
    kernel = _kernels.fused if (use_kernel if use_kernel is not None else _kernels.available()) else None
    merged = torch.empty(d_out, d_in)
    y = torch.empty(d_out, omega.shape[1]) if omega is not None else None
    rows = max(1, p.chunk_elems // d_in)
    block = torch.empty(len(fs), rows, d_in)
    for r0 in range(0, d_out, rows):
        r1 = min(d_out, r0 + rows)
        stack = block[:, : r1 - r0]
        for i, (a, b) in enumerate(zip(as_, bs)):
            torch.matmul(b[r0:r1], a, out=stack[i])
        if kernel is not None:
            _fused_block(stack if r1 - r0 == rows else stack.contiguous(), bs, grams, r0, r1, p, gen,
                         merged[r0:r1], kernel)
        else:
            for i in range(len(fs)):
                _sparsify(stack[i], p, gen, bs[i][r0:r1], grams[i])
            if p.sign_election:
                mask = calculate_majority_sign_mask(stack, method=p.majority_sign_method)
                merged[r0:r1] = disjoint_merge(stack, mask)
            else:
                torch.sum(stack, dim=0, out=merged[r0:r1])
        if y is not None:
            torch.matmul(merged[r0:r1], omega, out=y[r0:r1])
    del block
    if p.refactor == "exact":
        u, s, vh = torch.linalg.svd(merged, full_matrices=False)
        u, s, vh = u[:, :rank], s[:rank], vh[:rank]
    else:
        u, s, vh = la.randomized_svd(merged, rank, gen, y=y, niter=p.niter)
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
    out = {}
    for name in parents[0].modules:
        out[name] = _merge_module([p.modules[name] for p in parents], weights, params, generator)
    return parents[0].with_modules(out)
