"""Exact low-rank algebra on LoRA factors, in fp32, without forming delta W.

delta W = s * B @ A with B (d_out x r), A (r x d_in). QR of B and of A^T reduce everything to an
r x r (or k r x k r for k stacked adapters) core whose SVD is the SVD of delta W: O((d_in + d_out) r^2)
per module instead of a dense SVD's O(d_in d_out min(d_in, d_out)). :func:`svds` gets those R factors
from Gram matrices (Cholesky-QR: GEMMs, batched over modules; Householder where ill-conditioned) and
never copies a factor; per-module work runs on single-threaded workers (:func:`parallel_map`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch

from populora_core.services.runtime import torch_threads

Svd = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # U (d_out x k), S (k), Vh (k x d_in)


def best_rank(bs: torch.Tensor, as_: torch.Tensor, rank: int | None = None) -> Svd:
    """SVD of bs @ as_ (bs: d_out x m, as_: m x d_in), top ``rank`` triplets; exact, never dense.

    Householder QR of both stacks: exact whatever the conditioning (the fallback of :func:`svds`).
    """
    bs, as_ = bs.float(), as_.float()
    qb, rb = torch.linalg.qr(bs)  # d_out x p, p x m
    qa, ra = torch.linalg.qr(as_.T)  # d_in x q, q x m
    uc, s, vch = torch.linalg.svd(rb @ ra.T, full_matrices=False)
    u, vh = qb @ uc, vch @ qa.T
    if rank is not None:
        u, s, vh = u[:, :rank], s[:rank], vh[:rank]
    return u, s, vh


#: One term w * L @ R of a low-rank sum: L (d_out x p), R (p x d_in), w a scalar.
Block = tuple[torch.Tensor, torch.Tensor, float]

#: Cholesky-QR is used while both (column-equilibrated) Gram factors have a condition number below
#: this: its fp32 Gram then loses nothing visible (measured: error against a dense fp64 truncated SVD
#: stays below the Householder path's up to 1e3 and grows past it), else the module falls back to
#: Householder QR.
MAX_GRAM_COND = 1e3


@dataclass
class FactoredSvd:
    """U diag(S) Vh of sum_p w_p L_p R_p, kept as small matrices on the stack's own factors.

    U = sum_p L_p @ left[p] and Vh = sum_p right[p] @ R_p: materialising U or Vh (or refactoring
    straight into child factors) costs one matmul per block, and nothing d-sized is ever copied.
    """

    lefts: list[torch.Tensor]
    left: list[torch.Tensor]
    s: torch.Tensor
    right: list[torch.Tensor]
    rights: list[torch.Tensor]
    cholesky: bool

    def top(self, k: int) -> FactoredSvd:
        """The first ``k`` triplets."""
        return FactoredSvd(
            self.lefts,
            [m[:, :k] for m in self.left],
            self.s[:k],
            [m[:k] for m in self.right],
            self.rights,
            self.cholesky,
        )

    def with_s(self, s: torch.Tensor) -> FactoredSvd:
        """The same singular vectors with other singular values."""
        return FactoredSvd(self.lefts, self.left, s, self.right, self.rights, self.cholesky)

    def u(self, col_scale: torch.Tensor | None = None) -> torch.Tensor:
        """U (d_out x k), columns optionally multiplied by ``col_scale``."""
        smalls = self.left if col_scale is None else [m * col_scale for m in self.left]
        return _sum_of_products(list(zip(self.lefts, smalls)))

    def vh(self, row_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Vh (k x d_in), rows optionally multiplied by ``row_scale``."""
        smalls = self.right if row_scale is None else [row_scale[:, None] * m for m in self.right]
        return _sum_of_products(list(zip(smalls, self.rights)))


def _sum_of_products(terms: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """sum_i x_i @ y_i in fp32, one GEMM per term (no d-sized temporaries)."""
    (x, y), rest = terms[0], terms[1:]
    out = x.float() @ y.float()
    for x, y in rest:
        out.addmm_(x.float(), y.float())
    return out


def svds(
    stacks: list[list[Block]], rank: int | list[int], *, max_cond: float = MAX_GRAM_COND, threads: int | None = None
) -> list[FactoredSvd]:
    """Top-``rank`` SVD of sum_p w_p L_p R_p for each stack (one per module), exact, never dense.

    Cholesky-QR: the Gram matrices of X = [w_1 L_1 .. w_k L_k] and Y = [R_1; ..; R_k]^T are GEMMs
    (matmul speed, unlike Householder QR); their Cholesky factors Rx, Ry give the core Rx Ry^T whose
    SVD is that of the product. U S = X Ry^T Vc needs no inverse; V = Y Ry^-1 Vc divides by the
    right side's factor (LoRA's A side stays near its well-conditioned init; B carries the spectrum).
    The small steps (Cholesky, condition numbers, core SVDs) run batched over the modules, in fp64.
    A module whose Gram is singular or worse conditioned than ``max_cond`` (B = 0, duplicated or
    rank-deficient parents) takes the Householder path instead.
    """
    ranks = [rank] * len(stacks) if isinstance(rank, int) else list(rank)
    n = workers() if threads is None else threads
    grams = parallel_map(_grams, stacks, n)
    out: list[FactoredSvd | None] = [None] * len(stacks)
    groups: dict[tuple[int, int, str], list[int]] = {}
    for i, (gx, gy) in enumerate(grams):
        groups.setdefault((gx.shape[0], gy.shape[0], str(gx.device)), []).append(i)
    fallback = []
    for idx in groups.values():
        with torch_threads(1):
            small = _cholesky_svds([grams[i] for i in idx], [stacks[i] for i in idx], [ranks[i] for i in idx], max_cond)
        for i, res in zip(idx, small):
            if res is None:
                fallback.append(i)
            out[i] = res
    for i, res in zip(fallback, parallel_map(lambda i: _householder(stacks[i], ranks[i]), fallback, n)):
        out[i] = res
    return [o for o in out if o is not None]


def _cholesky_svds(
    grams: list[tuple[torch.Tensor, torch.Tensor]], stacks: list[list[Block]], ranks: list[int], max_cond: float
) -> list[FactoredSvd | None]:
    """The batched small steps for modules of one Gram size; None where Cholesky-QR is not exact."""
    rx, ok_x = _scaled_cholesky(torch.stack([g[0] for g in grams]), max_cond)
    ry, ok_y = _scaled_cholesky(torch.stack([g[1] for g in grams]), max_cond)
    _, s, vch = torch.linalg.svd(rx @ ry.mT)
    left = ry.mT @ vch.mT / s[:, None, :]  # U = X Ry^T Vc S^-1 (S > 0: both Grams are definite)
    right = torch.linalg.solve_triangular(ry, vch.mT, upper=True).mT  # Vh = Vc^T Ry^-T Y^T
    return [
        _factored(stack, left[i, :, :r], s[i, :r], right[i, :r]) if good else None
        for i, (stack, r, good) in enumerate(zip(stacks, ranks, (ok_x & ok_y).tolist()))
    ]


def _scaled_cholesky(g: torch.Tensor, max_cond: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched upper Cholesky factors of Grams g = R^T R, and whether each is trustworthy.

    The fp32 Gram's rounding is relative to its columns' norms, so what decides its accuracy is the
    condition number of the column-equilibrated Gram D^-1 g D^-1 (scaling a factor's columns, as
    LoRA's B does with the spectrum, costs nothing); R = chol(D^-1 g D^-1) D. Untrustworthy
    factors (singular, zero columns, condition above ``max_cond``) come back as the identity.
    """
    d = torch.diagonal(g, dim1=-2, dim2=-1).clamp(min=0.0).sqrt()
    positive = (d > 0).all(dim=-1)
    d = torch.where(d > 0, d, torch.ones_like(d))
    equilibrated = g / (d[..., :, None] * d[..., None, :])
    rs, info = torch.linalg.cholesky_ex(equilibrated, upper=True)
    eye = torch.eye(g.shape[-1], dtype=g.dtype, device=g.device)
    # cond(R)^2 = cond(R^T R): the Gram's eigenvalues give it without an SVD of each factor (3x faster here)
    eigenvalues = torch.linalg.eigvalsh(equilibrated)
    low, high = eigenvalues[..., 0], eigenvalues[..., -1]
    ok = positive & (info == 0) & (low > 0) & (high <= max_cond**2 * low)
    return torch.where(ok[:, None, None], rs * d[..., None, :], eye), ok


def _grams(stack: list[Block]) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 copies of the Gram matrices of X = [w_1 L_1 .. w_k L_k] and Y = [R_1; ..; R_k]^T."""
    ls = [b[0].float() for b in stack]
    rs = [b[1].float() for b in stack]
    w = torch.cat([torch.full((b[0].shape[1],), float(b[2]), dtype=torch.float64, device=ls[0].device) for b in stack])
    gx = _block_gram([x.T for x in ls])
    return w[:, None] * gx * w[None, :], _block_gram(rs)


def _block_gram(rows: list[torch.Tensor]) -> torch.Tensor:
    """fp64 [x_p @ x_q^T]_pq, one GEMM per block on or above the diagonal (it is symmetric)."""
    k = len(rows)
    blocks: list[list[torch.Tensor | None]] = [[None] * k for _ in range(k)]
    for p in range(k):
        for q in range(p, k):
            blocks[p][q] = (rows[p] @ rows[q].T).double()
            if q != p:
                blocks[q][p] = blocks[p][q].T  # type: ignore[union-attr]
    return torch.cat([torch.cat([b for b in row if b is not None], dim=1) for row in blocks])


def _factored(stack: list[Block], left: torch.Tensor, s: torch.Tensor, right: torch.Tensor) -> FactoredSvd:
    """Split the fp64 small matrices by block, weights folded into the left ones."""
    sizes = [b[0].shape[1] for b in stack]
    lefts = [(float(b[2]) * part).float() for b, part in zip(stack, left.split(sizes, dim=0))]
    rights = [part.float().contiguous() for part in right.split(sizes, dim=1)]
    return FactoredSvd([b[0] for b in stack], lefts, s.float(), rights, [b[1] for b in stack], True)


def _householder(stack: list[Block], rank: int) -> FactoredSvd:
    bs = torch.cat([float(w) * lb.float() for lb, _, w in stack], dim=1)
    as_ = torch.cat([rb.float() for _, rb, _ in stack], dim=0)
    u, s, vh = best_rank(bs, as_, rank)
    eye = torch.eye(s.shape[0], device=u.device)
    return FactoredSvd([u], [eye], s, [eye], [vh], False)


def refactor_factored(
    f: FactoredSvd, scale: float, rank: int, a_floor: float = 0.0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`refactor` of a :class:`FactoredSvd`, the split folded into its small matrices.

    Same (A, B) as refactor(f.u(), f.s, f.vh(), ...) without materialising U or Vh first.
    """
    s = f.s[:rank].clamp(min=0.0)
    n = torch.sqrt(s / scale).clamp(min=a_floor) if a_floor > 0 else torch.sqrt(s / scale)
    safe = torch.where(n > 0, n, torch.ones_like(n))
    k = s.shape[0]
    trim = f.top(k)
    a, b = trim.vh(n), trim.u(s / (scale * safe))
    if k < rank:  # fewer components than the rank: the rest are zero
        a = torch.cat([a, a.new_zeros(rank - k, a.shape[1])])
        b = torch.cat([b, b.new_zeros(b.shape[0], rank - k)], dim=1)
    return a.to(dtype).contiguous(), b.to(dtype).contiguous()


def parallel_map(fn: Any, items: list[Any], threads: int | None = None) -> list[Any]:
    """``[fn(x) for x in items]`` on ``threads`` single-threaded workers (default: :func:`workers`).

    Per-module GEMMs of tall, thin factors are too small to split across cores: on a shared CPU a
    2-thread GEMM waits for the slower thread at every call (measured 20 ms instead of 0.5 ms for
    one 18944 x 32 Gram). One module per worker keeps every core busy and each result the same on
    any number of threads. CUDA tensors run in order on the calling thread.
    """
    n = workers() if threads is None else threads
    if n <= 1 or len(items) <= 1 or _on_cuda(items[0]):
        with torch_threads(1):
            return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    with torch_threads(1), ThreadPoolExecutor(min(n, len(items))) as pool:
        return list(pool.map(fn, items))


_OPERATOR = threading.local()


def workers() -> int:
    """Worker threads for per-module work: torch's thread count when the running operator started."""
    return getattr(_OPERATOR, "workers", None) or torch.get_num_threads()


F = TypeVar("F", bound=Callable[..., Any])


def module_parallel(fn: F) -> F:
    """Run an operator with torch on one thread and its per-module work on :func:`workers` threads.

    The process's torch thread count (``runtime.threads``) stays the one knob: it becomes the number of modules
    worked on at once.
    """

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if getattr(_OPERATOR, "workers", None):
            return fn(*args, **kwargs)
        _OPERATOR.workers = torch.get_num_threads()
        try:
            with torch_threads(1):
                return fn(*args, **kwargs)
        finally:
            _OPERATOR.workers = None

    return cast(F, run)


def _on_cuda(item: Any) -> bool:
    while isinstance(item, (list, tuple)) and item:
        item = item[0]
    return isinstance(item, torch.Tensor) and item.is_cuda


def canonical(a: torch.Tensor, b: torch.Tensor, scale: float) -> Svd:
    """Exact SVD of scale * b @ a: delta W = U diag(S) Vh, S descending."""
    return best_rank(scale * b.float(), a.float())


def rms_row_norm(as_: list[torch.Tensor]) -> float:
    """RMS norm of the rows of the given A factors: the A-side scale training keeps."""
    total = sum(float(torch.linalg.vector_norm(a, dtype=torch.float32)) ** 2 for a in as_)
    rows = sum(a.shape[0] for a in as_)
    return (total / max(rows, 1)) ** 0.5


def refactor(
    u: torch.Tensor,
    s: torch.Tensor,
    vh: torch.Tensor,
    scale: float,
    rank: int,
    a_floor: float = 0.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) of rank ``rank`` with scale * B @ A == U diag(S) Vh exactly.

    Component i gets A row n_i * Vh_i and B column U_i * S_i / (scale * n_i) with
    n_i = max(sqrt(S_i / scale), a_floor): the balanced split, except that a component with S ~ 0
    keeps an A row of norm ``a_floor`` (B column 0), so it can still learn. Missing components (the
    input has fewer than ``rank``) are zero.
    """
    k = s.shape[0]
    if k < rank:
        u = torch.cat([u, u.new_zeros(u.shape[0], rank - k)], dim=1)
        vh = torch.cat([vh, vh.new_zeros(rank - k, vh.shape[1])], dim=0)
        s = torch.cat([s, s.new_zeros(rank - k)])
    elif k > rank:
        u, s, vh = u[:, :rank], s[:rank], vh[:rank]
    s = s.clamp(min=0.0)
    n = torch.sqrt(s / scale).clamp(min=a_floor) if a_floor > 0 else torch.sqrt(s / scale)
    safe = torch.where(n > 0, n, torch.ones_like(n))
    a = n[:, None] * vh
    b = u * (s / (scale * safe))[None, :]
    return a.to(dtype).contiguous(), b.to(dtype).contiguous()


def sign_fixed_pairs(u: torch.Tensor, vh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(U, Vh) with each pair (u_i, v_i) flipped so that v_i's largest-magnitude entry is positive.

    An SVD fixes singular vectors only up to such flips, and LAPACK builds (CPU, CUDA, Householder
    or Cholesky-QR) choose differently; anything that adds noise to U or V needs one convention.
    """
    big = vh.abs().argmax(dim=1, keepdim=True)
    sign = torch.where(vh.gather(1, big) < 0, -1.0, 1.0).to(vh.dtype)
    return u * sign.T, vh * sign


def rotated(basis: torch.Tensor, noise: torch.Tensor, eps: float) -> torch.Tensor:
    """Orthonormal columns close to ``basis``: Q of basis + eps * noise / sqrt(d), signs kept.

    With Gaussian ``noise`` (same shape) each column turns by about ``eps`` radians towards a random
    direction (in or out of the span).
    """
    return sign_fixed_q(basis + noise * (eps / basis.shape[0] ** 0.5))


def sign_fixed_q(x: torch.Tensor, max_cond: float = MAX_GRAM_COND) -> torch.Tensor:
    """Q of x = QR with diag(R) >= 0, so Q depends continuously on x (no random sign flips).

    Cholesky-QR (a Cholesky factor has a positive diagonal, so it is this very Q) while x is well
    conditioned, as a noisy orthonormal basis is; Householder QR otherwise.
    """
    r, info = torch.linalg.cholesky_ex((x.T @ x).double(), upper=True)
    if int(info) == 0 and float(torch.linalg.cond(r)) <= max_cond:
        eye = torch.eye(r.shape[0], dtype=r.dtype, device=r.device)
        return x @ torch.linalg.solve_triangular(r, eye, upper=True).float()
    q, rh = torch.linalg.qr(x)
    diag = torch.diagonal(rh)
    return q * torch.where(diag < 0, -torch.ones_like(diag), torch.ones_like(diag))[None, :]


def sketched_svd(m: torch.Tensor, sketch: torch.Tensor, rank: int, *, niter: int) -> Svd:
    """Top-``rank`` SVD of a dense m from its sketch m @ omega (Halko et al.'s randomized SVD; a merge
    computes the sketch while it builds m, block by block), with ``niter`` power iterations."""
    q, _ = torch.linalg.qr(sketch)
    for _ in range(niter):
        z, _ = torch.linalg.qr(m.T @ q)
        q, _ = torch.linalg.qr(m @ z)
    ub, s, vh = torch.linalg.svd(q.T @ m, full_matrices=False)
    return (q @ ub)[:, :rank], s[:rank], vh[:rank]


def gaussian_probes(rank: int, n_probe: int, oversample: int, limit: int) -> int:
    """How many Gaussian probe columns a randomized SVD draws next to ``n_probe`` given directions
    (for a merge, the parents' row space: the signal lives there), capped by min(m.shape)."""
    n_rand = max(rank + oversample - n_probe, oversample, 1)
    return max(min(n_rand, limit - n_probe), 0) if limit > n_probe else 0
