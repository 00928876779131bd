"""The compiled dense merge behind ``dare``/``ties``/``della``: sparsify and combine blocks of delta W rows.

Imported only when a merge runs, never at plugin load: numba is slow to import, and vLLM cannot be
imported after numba's llvmlite in the same process (vLLM's kernel-override scan trips over it).

The caller rebuilds a block of each parent's delta W rows with one GEMM of its factors (matmul speed);
here each row is sparsified, weighted and combined (sum, or TIES sign election + disjoint mean) while
the block is in cache, and written once. At 7B shapes that is 6.5 G entries per parent; eager torch
needed ~20 memory passes over each and a sequential Mersenne-Twister draw per entry, which dominated
the time. The keep decisions come from a counter-based hash of (per-parent seed, entry index):
reproducible from the operator's generator, independent of blocking and thread count, and cheap
enough to vectorize.
"""

from __future__ import annotations

import math

import numba
import numpy as np

RANDOM, MAGNITUDE, DELLA = 0, 1, 2
U24 = 1 << 24  # keep decisions compare 24 random bits: probabilities are quantised to 2^-24


@numba.njit(inline="always")
def uniform24(seed, index):  # pragma: no cover - compiled
    """An integer uniform in [0, 2^24) for entry ``index`` of the stream keyed by ``seed`` (< 2^32).

    One round of lowbias32 (Wellons), a 32-bit avalanche bijection, on index XOR seed; the caller
    draws the seeds from the operator's generator. 32-bit lanes: 16 entries per AVX-512 vector.
    """
    x = np.uint32(np.uint32(index) ^ np.uint32(seed))
    x = np.uint32(x ^ (x >> np.uint32(16)))
    x = np.uint32(x * np.uint32(0x7FEB352D))
    x = np.uint32(x ^ (x >> np.uint32(15)))
    x = np.uint32(x * np.uint32(0x846CA68B))
    x = np.uint32(x ^ (x >> np.uint32(16)))
    return x >> np.uint32(8)


@numba.njit(inline="always")
def _erf_pos(z):  # pragma: no cover - compiled
    """erf(z) for z >= 0, Abramowitz & Stegun 7.1.28 (|error| < 3e-7), branch-free so it vectorizes."""
    z = min(z, np.float32(6.0))
    t = np.float32(1.0) + z * (
        np.float32(0.0705230784)
        + z
        * (
            np.float32(0.0422820123)
            + z
            * (
                np.float32(0.0092705272)
                + z * (np.float32(0.0001520143) + z * (np.float32(0.0002765672) + z * np.float32(0.0000430638)))
            )
        )
    )
    t2 = t * t
    t4 = t2 * t2
    t8 = t4 * t4
    return np.float32(1.0) - np.float32(1.0) / (t8 * t8)


@numba.njit(inline="always")
def _drop(x, prob, seed, index, rs):  # pragma: no cover - compiled
    """Keep x with probability ``prob`` (divided by prob when rs = 1, as is when rs = 0), else 0."""
    q = prob * rs + (np.float32(1.0) - rs)
    keep = np.float32(np.float32(np.int32(uniform24(seed, index))) < prob * np.float32(U24))  # < 2^24: exact
    return x * keep / q  # branch-free, so the loop vectorizes


@numba.njit(fastmath=True, error_model="numpy")
def _sparsify_row(xr, frac, method, thr, seed, base, density, epsilon, rescale, exact):  # pragma: no cover
    """Drop entries of one row of delta W in place; rescale the kept ones by 1/keep-probability."""
    n = xr.shape[0]
    if method == RANDOM:
        t = max(1, round(density * U24))
        sc = np.float32(U24 / t) if rescale else np.float32(1.0)
        if t >= U24:
            for j in range(n):
                xr[j] *= sc
        else:
            tu = np.uint32(t)
            for j in range(n):
                xr[j] = xr[j] * (sc * np.float32(uniform24(seed, base + j) < tu))
    elif method == MAGNITUDE:
        th = np.float32(thr)
        if exact:
            keep = max(1, math.ceil(density * n))
            th = np.partition(np.abs(xr), n - keep)[n - keep]
        sc = np.float32(1.0 / density) if rescale else np.float32(1.0)
        for j in range(n):
            xr[j] = xr[j] * sc if abs(xr[j]) >= th else np.float32(0.0)
    else:
        lo = np.float32(density - epsilon)
        span = np.float32(2.0 * epsilon)
        rs = np.float32(1.0) if rescale else np.float32(0.0)
        if exact:
            order = np.argsort(np.abs(xr))
            step = np.float32(1.0 / max(n - 1, 1))
            for j in range(n):
                frac[order[j]] = np.float32(j) * step
            for j in range(n):
                xr[j] = _drop(xr[j], lo + span * frac[j], seed, base + j, rs)
        else:
            inv = np.float32(1.0 / (thr * math.sqrt(2.0))) if thr > 0 else np.float32(0.0)
            for j in range(n):
                xr[j] = _drop(xr[j], lo + span * _erf_pos(abs(xr[j]) * inv), seed, base + j, rs)


@numba.njit(fastmath=True, nogil=True, cache=True, error_model="numpy")
def sparsify_rows(
    xs, thr, seeds, row0, out, method, density, epsilon, rescale, sign_election, frequency, exact
):  # pragma: no cover - compiled
    """out = combine_p sparsify(xs[p]) for a block of rows of delta W (xs is overwritten).

    xs (k, rows, d_in): rows row0.. of each parent's weighted delta W (a GEMM of its factors, while
    they are in cache); thr (k, d_out): per row the magnitude cut (magnitude, normal ranking) or the
    row RMS (della, normal ranking); seeds (k,) uint64 < 2^32: each parent's keep-decision stream,
    indexed by the entry's position in the whole module. One thread: the caller runs modules in
    parallel, so nothing here waits for another core.
    """
    k, rows, d_in = xs.shape
    frac = np.empty(d_in, np.float32)
    tot = np.empty(d_in, np.float32)
    cnt = np.empty(d_in, np.float32)
    for i in range(rows):
        base = (row0 + i) * d_in
        for p in range(k):
            _sparsify_row(xs[p, i], frac, method, thr[p, row0 + i], seeds[p], base, density, epsilon, rescale, exact)
        orow = out[i]
        if not sign_election:
            for j in range(d_in):
                orow[j] = xs[0, i, j]
            for p in range(1, k):
                for j in range(d_in):
                    orow[j] += xs[p, i, j]
            continue
        # PEFT's calculate_majority_sign_mask + disjoint_merge, branch-free so the loops vectorize
        for j in range(d_in):
            tot[j] = np.float32(0.0)
            orow[j] = np.float32(0.0)
            cnt[j] = np.float32(0.0)
        for p in range(k):
            if frequency:
                for j in range(d_in):
                    tot[j] += np.float32(xs[p, i, j] > 0) - np.float32(xs[p, i, j] < 0)
            else:
                for j in range(d_in):
                    tot[j] += xs[p, i, j]
        for j in range(d_in):  # the elected sign: + on ties, as PEFT
            tot[j] = np.float32(1.0) if tot[j] >= 0 else np.float32(-1.0)
        for p in range(k):
            for j in range(d_in):
                agree = np.float32(xs[p, i, j] * tot[j] > 0)  # a dropped (zero) entry never agrees
                orow[j] += xs[p, i, j] * agree
                cnt[j] += agree
        for j in range(d_in):
            orow[j] = orow[j] / max(cnt[j], np.float32(1.0))
