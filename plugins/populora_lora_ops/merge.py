"""One dense delta-W merge behind ``dare``, ``ties``, ``della`` (and the general ``delta_merge``).

Sparsifying merges are defined on dense delta W, so they cannot stay in factor space. Per module,
block by block of rows: one GEMM rebuilds each parent's rows from its factors, the compiled kernel
(:mod:`_merge_kernel`) sparsifies, weights and combines them (plain sum, or TIES sign election +
disjoint mean as ``peft.utils.merge_utils`` defines them) into the module's dense buffer, and a
second GEMM adds the block's rows of the randomized SVD's sketch while they are still in cache; the
buffer is then refactored to rank r. Modules run in parallel, one per worker thread, each on one
core: every heavy step is a GEMM or the kernel, and no step waits for another core.
Peak memory: one module's delta W per worker plus a block of rows.
"""

from __future__ import annotations

import math
import queue
from dataclasses import dataclass
from typing import Any

import torch

from populora_core.api.lora import LoraFactors, LoraWeights

from . import linalg as la
from .parents import _refactored, _warn_zero_crossover

#: Entries of delta W per parent in one block of rows: a few hundred kB, so the rebuilt rows, the
#: merged rows and the sketch GEMM stay in this core's cache.
BLOCK_ENTRIES = 1 << 18

#: Module-sized buffers (one per worker) are capped at this many bytes: fewer workers rather than a
#: peak over 1 GB (7B: 271 MB per buffer, so two workers).
BUFFER_BUDGET = 768 << 20


def _row_sigma(b: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """RMS of each row of b @ a, from a a^T (exact, no dense rows)."""
    return (((b @ (a @ a.T)) * b).sum(1).clamp(min=0.0) / a.shape[1]).sqrt()


def _row_thresholds(p: Any, as_: list[torch.Tensor], bs: list[torch.Tensor]) -> torch.Tensor:
    """(k, d_out): the magnitude cut (magnitude) or the row RMS (della), under 'normal' ranking.

    Rows of a low-rank delta W are close to Gaussian, so the top-density cut of a row is its RMS times
    the normal quantile, and an entry's in-row magnitude rank is erf(|x| / (RMS sqrt 2)).
    """
    if p.ranking == "exact" or p.method == "random":
        return torch.zeros(len(bs), bs[0].shape[0], device=bs[0].device)
    sigma = torch.stack([_row_sigma(b, a) for a, b in zip(as_, bs)])
    if p.method == "della":
        return sigma
    quantile = math.sqrt(2.0) * float(torch.erfinv(torch.tensor(1.0 - p.density, dtype=torch.float64)))
    return sigma * quantile


@dataclass
class _Draws:
    """What one module's merge takes from the generator, drawn in the generator's order up front."""

    seeds: torch.Tensor  # (k,) keep-decision streams, < 2^32
    gauss: torch.Tensor | None  # Gaussian probe columns of the randomized SVD (None: exact SVD)


def _draw(fs: list[LoraFactors], p: Any, gen: torch.Generator) -> _Draws:
    seeds = torch.randint(0, 1 << 32, (len(fs),), generator=gen, dtype=torch.int64, device=gen.device)
    if p.refactor == "exact":
        return _Draws(seeds, None)
    d_out, d_in = fs[0].B.shape[0], fs[0].A.shape[1]
    n_probe = min(d_in, sum(f.A.shape[0] for f in fs))  # columns of Q of the stacked A^T
    n_rand = la.gaussian_probes(fs[0].A.shape[0], n_probe, p.oversample, min(d_out, d_in))
    return _Draws(seeds, torch.randn(d_in, n_rand, generator=gen, device=gen.device))


def _merge_into(
    fs: list[LoraFactors],
    weights: list[float],
    p: Any,
    seeds: torch.Tensor,
    out: torch.Tensor,
    omega: torch.Tensor | None = None,
    *,
    compiled: bool | None = None,
) -> torch.Tensor | None:
    """Fill ``out`` (d_out x d_in) with the merged dense delta W; returns out @ omega if given.

    ``compiled`` (default: on CPU) picks the numba kernel; elsewhere (CUDA) the same arithmetic runs
    as torch ops on the tensors' device.
    """
    as_ = torch.stack([f.A.float() for f in fs])  # (k, r, d_in)
    bs = torch.stack([f.B.float() * (f.scale * w) for f, w in zip(fs, weights)])  # weighted before sparsifying, as PEFT
    thr = _row_thresholds(p, list(as_), list(bs)).float().contiguous()
    k, d_out, d_in = len(fs), out.shape[0], out.shape[1]
    rows = max(1, min(d_out, BLOCK_ENTRIES // d_in))
    scratch = torch.empty(k * rows * d_in, device=out.device)
    sketch = None if omega is None else torch.empty(d_out, omega.shape[1], device=out.device)
    sparsify = (
        _compiled_sparsify(p, thr, seeds) if (out.device.type == "cpu" if compiled is None else compiled) else None
    )
    for i0 in range(0, d_out, rows):
        n = min(rows, d_out - i0)
        xs = scratch[: k * n * d_in].view(k, n, d_in)
        torch.bmm(bs[:, i0 : i0 + n], as_, out=xs)
        if sparsify is not None:
            sparsify(xs, i0, out[i0 : i0 + n])
        else:
            out[i0 : i0 + n] = _sparsify_combine(xs, thr[:, i0 : i0 + n], seeds.tolist(), i0, p)
        if sketch is not None and omega is not None:
            torch.mm(out[i0 : i0 + n], omega, out=sketch[i0 : i0 + n])
    return sketch


def _compiled_sparsify(p: Any, thr: torch.Tensor, seeds: torch.Tensor) -> Any:
    """The numba kernel with this merge's settings bound: (xs, row0, out rows) -> None."""
    from . import _merge_kernel as kernel

    thr_np, seeds_u64 = thr.numpy(), seeds.cpu().numpy().astype("uint64")
    method = {"random": kernel.RANDOM, "magnitude": kernel.MAGNITUDE, "della": kernel.DELLA}[p.method]
    settings = (float(p.density), float(p.epsilon), bool(p.rescale), bool(p.sign_election))
    flags = (p.majority_sign_method == "frequency", p.ranking == "exact")

    def run(xs: torch.Tensor, row0: int, out_rows: torch.Tensor) -> None:
        kernel.sparsify_rows(xs.numpy(), thr_np, seeds_u64, row0, out_rows.numpy(), method, *settings, *flags)

    return run


_U24 = 1 << 24


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for 0 <= x, c < 2^32 in int64, split so that no product overflows."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & 0xFFFFFFFF


def _uniform24(seed: int, index: torch.Tensor) -> torch.Tensor:
    """The kernel's keep-decision stream (lowbias32 of index XOR seed, top 24 bits) in torch ops."""
    x = (index & 0xFFFFFFFF) ^ seed
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    x = x ^ (x >> 16)
    return x >> 8


def _erf_pos(z: torch.Tensor) -> torch.Tensor:
    """The kernel's erf for z >= 0 (Abramowitz & Stegun 7.1.28), so both paths keep the same entries."""
    z = z.clamp(max=6.0)
    c = (0.0000430638, 0.0002765672, 0.0001520143, 0.0092705272, 0.0422820123, 0.0705230784)
    t = torch.full_like(z, c[0])
    for coef in c[1:]:
        t = t * z + coef
    t = t * z + 1.0
    t8 = t.square().square().square()
    return 1.0 - 1.0 / t8.square()


def _sparsify_combine(xs: torch.Tensor, thr: torch.Tensor, seeds: list[int], row0: int, p: Any) -> torch.Tensor:
    """:func:`_merge_kernel.sparsify_rows` as torch ops on any device (thr: this block's rows)."""
    _, n, d_in = xs.shape
    index = torch.arange(row0 * d_in, (row0 + n) * d_in, device=xs.device).view(n, d_in)
    kept = []
    for x, row_thr, seed in zip(xs, thr, seeds):
        if p.method == "random":
            t = max(1, round(p.density * _U24))
            scale = _U24 / t if p.rescale else 1.0
            x = x * scale if t >= _U24 else x * ((_uniform24(seed, index) < t) * scale)
        elif p.method == "magnitude":
            if p.ranking == "exact":
                keep = max(1, math.ceil(p.density * d_in))
                row_thr = x.abs().kthvalue(d_in - keep + 1, dim=1).values
            scale = 1.0 / p.density if p.rescale else 1.0
            x = torch.where(x.abs() >= row_thr[:, None], x * scale, torch.zeros_like(x))
        else:
            if p.ranking == "exact":
                frac = x.abs().argsort(dim=1).argsort(dim=1).float() / max(d_in - 1, 1)
            else:
                inv = torch.where(row_thr > 0, 1.0 / (row_thr * math.sqrt(2.0)), torch.zeros_like(row_thr))
                frac = _erf_pos(x.abs() * inv[:, None])
            prob = (p.density - p.epsilon) + (2.0 * p.epsilon) * frac
            keep_mask = _uniform24(seed, index).float() < prob * _U24
            x = x * keep_mask / (prob if p.rescale else 1.0)
        kept.append(x)
    stack = torch.stack(kept)
    if not p.sign_election:
        return stack.sum(0)
    votes = stack.sign() if p.majority_sign_method == "frequency" else stack
    elected = torch.where(votes.sum(0) >= 0, 1.0, -1.0)  # + on ties, as PEFT
    agree = (stack * elected > 0).float()  # a dropped (zero) entry never agrees
    return (stack * agree).sum(0) / agree.sum(0).clamp(min=1.0)


def dense_merge(
    fs: list[LoraFactors], weights: list[float], p: Any, generator: torch.Generator, buffer: torch.Tensor | None = None
) -> torch.Tensor:
    """The merged dense delta W of one module (sparsified, weighted, combined), before refactoring.

    ``buffer`` (flat fp32, at least d_out * d_in) is reused across modules: a fresh 271 MB buffer per
    7B MLP module costs ~0.1 s of page faults.
    """
    seeds = torch.randint(0, 1 << 32, (len(fs),), generator=generator, dtype=torch.int64, device=generator.device)
    shape = (fs[0].B.shape[0], fs[0].A.shape[1])
    out = torch.empty(shape, device=fs[0].A.device) if buffer is None else buffer[: shape[0] * shape[1]].view(shape)
    _merge_into(fs, weights, p, seeds, out)
    return out


def _merge_module(
    fs: list[LoraFactors], weights: list[float], p: Any, draws: _Draws, buffer: torch.Tensor
) -> LoraFactors:
    rank = fs[0].A.shape[0]
    shape = (fs[0].B.shape[0], fs[0].A.shape[1])
    merged = buffer[: shape[0] * shape[1]].view(shape)
    if draws.gauss is None:
        _merge_into(fs, weights, p, draws.seeds, merged)
        u, s, vh = torch.linalg.svd(merged, full_matrices=False)
        u, s, vh = u[:, :rank], s[:rank], vh[:rank]
    else:
        probe, _ = torch.linalg.qr(torch.cat([f.A.float() for f in fs], dim=0).T)  # parents' row space: the signal
        omega = torch.cat([probe, draws.gauss.to(probe.device)], dim=1)
        sketch = _merge_into(fs, weights, p, draws.seeds, merged, omega)
        assert sketch is not None
        u, s, vh = la.sketched_svd(merged, sketch, rank, niter=p.niter)
    return _refactored(u, s, vh, fs[0], [f.A for f in fs], p)


@la.module_parallel
def delta_merge(parents: list[LoraWeights], params: Any, generator: torch.Generator) -> LoraWeights:
    """Sparsify each parent's delta W (random / magnitude / della), combine, refactor to rank r."""
    op = {"random": "dare", "magnitude": "ties", "della": "della"}[params.method]
    _warn_zero_crossover(parents, op)
    k = len(parents)
    if params.weights is None:
        weights = [1.0] * k if params.sign_election else [1.0 / k] * k
    elif len(params.weights) != k:
        from populora_core.api.errors import UserError

        raise UserError(f"{op}: weights has {len(params.weights)} entries for {k} parents")
    else:
        weights = [float(w) for w in params.weights]
    names = list(parents[0].modules)
    fss = [[p.modules[n] for p in parents] for n in names]
    draws = [_draw(fs, params, generator) for fs in fss]  # module by module, as the generator's stream runs
    sizes = [fs[0].B.shape[0] * fs[0].A.shape[1] for fs in fss]
    workers = max(1, min(la.workers(), len(names), BUFFER_BUDGET // (4 * max(sizes))))
    buffers: queue.SimpleQueue[torch.Tensor] = queue.SimpleQueue()
    for _ in range(workers):
        buffers.put(torch.empty(max(sizes), device=fss[0][0].A.device))

    def merge_one(i: int) -> LoraFactors:
        buffer = buffers.get()
        try:
            return _merge_module(fss[i], weights, params, draws[i], buffer)
        finally:
            buffers.put(buffer)

    largest_first = sorted(range(len(names)), key=lambda i: -sizes[i])  # the last modules to finish are small
    merged = dict(zip(largest_first, la.parallel_map(merge_one, largest_first, threads=workers)))
    return parents[0].with_modules({name: merged[i] for i, name in enumerate(names)})
