"""Exact low-rank algebra on LoRA factors, in fp32, without forming delta W.

delta W = s * B @ A with B (d_out x r), A (r x d_in). QR of B and of A^T reduce everything to an
r x r (or k r x k r for k stacked adapters) core whose SVD is the SVD of delta W: O((d_in + d_out) r^2)
per module instead of a dense SVD's O(d_in d_out min(d_in, d_out)).
"""

from __future__ import annotations

import torch

Svd = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # U (d_out x k), S (k), Vh (k x d_in)


def best_rank(bs: torch.Tensor, as_: torch.Tensor, rank: int | None = None) -> Svd:
    """SVD of bs @ as_ (bs: d_out x m, as_: m x d_in), top ``rank`` triplets; exact, never dense.

    bs and as_ are stacked (already weighted and scaled) factors of one or more adapters.
    """
    bs, as_ = bs.float(), as_.float()
    qb, rb = torch.linalg.qr(bs)  # d_out x p, p x m
    qa, ra = torch.linalg.qr(as_.T)  # d_in x q, q x m
    uc, s, vch = torch.linalg.svd(rb @ ra.T, full_matrices=False)
    u, vh = qb @ uc, vch @ qa.T
    if rank is not None:
        u, s, vh = u[:, :rank], s[:rank], vh[:rank]
    return u, s, vh


def canonical(a: torch.Tensor, b: torch.Tensor, scale: float) -> Svd:
    """Exact SVD of scale * b @ a: delta W = U diag(S) Vh, S descending."""
    return best_rank(scale * b.float(), a.float())


def weighted_best_rank(factors: list[tuple[torch.Tensor, torch.Tensor, float]], weights: list[float], rank: int) -> Svd:
    """Exact best rank-``rank`` approximation of sum_i w_i s_i B_i A_i (Eckart-Young on the stack)."""
    bs = torch.cat([w * s * b.float() for (a, b, s), w in zip(factors, weights)], dim=1)
    as_ = torch.cat([a.float() for a, _, _ in factors], dim=0)
    return best_rank(bs, as_, rank)


def rms_row_norm(as_: list[torch.Tensor]) -> float:
    """RMS norm of the rows of the given A factors: the A-side scale training keeps."""
    total = sum(float(a.float().pow(2).sum()) for a in as_)
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


def random_orthonormal(rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    """A rows x cols matrix with orthonormal columns, Haar-distributed (sign-fixed QR of a Gaussian)."""
    return _sign_fixed_q(torch.randn(rows, cols, generator=generator))


def rotate(basis: torch.Tensor, eps: float, generator: torch.Generator) -> torch.Tensor:
    """Orthonormal columns close to ``basis``: QR of basis + eps * G / sqrt(d), signs kept.

    Each column turns by about ``eps`` radians towards a random direction (in or out of the span).
    """
    d = basis.shape[0]
    noisy = basis + eps * torch.randn(basis.shape, generator=generator) / d**0.5
    return _sign_fixed_q(noisy)


def _sign_fixed_q(x: torch.Tensor) -> torch.Tensor:
    """Q of x = QR with diag(R) >= 0, so Q depends continuously on x (no random sign flips)."""
    q, r = torch.linalg.qr(x)
    diag = torch.diagonal(r)
    return q * torch.where(diag < 0, -torch.ones_like(diag), torch.ones_like(diag))[None, :]


def randomized_svd(
    m: torch.Tensor,
    rank: int,
    generator: torch.Generator,
    *,
    probe: torch.Tensor | None = None,
    oversample: int = 8,
    niter: int = 1,
) -> Svd:
    """Top-``rank`` SVD of a dense m (Halko et al.), seeded by ``generator``.

    ``probe`` (d_in x p) are extra probe directions (for a merge, the parents' row space: the signal
    lives there) next to ``rank + oversample - p`` Gaussian ones.
    """
    omega = probe_matrix(m.shape[1], rank, generator, probe=probe, oversample=oversample, limit=min(m.shape))
    q, _ = torch.linalg.qr(m @ omega)
    for _ in range(niter):
        z, _ = torch.linalg.qr(m.T @ q)
        q, _ = torch.linalg.qr(m @ z)
    ub, s, vh = torch.linalg.svd(q.T @ m, full_matrices=False)
    return (q @ ub)[:, :rank], s[:rank], vh[:rank]


def probe_matrix(
    d_in: int, rank: int, generator: torch.Generator, *, probe: torch.Tensor | None, oversample: int, limit: int
) -> torch.Tensor:
    """Probe columns of a randomized range finder: the given directions plus Gaussian ones."""
    n_probe = 0 if probe is None else probe.shape[1]
    n_rand = max(rank + oversample - n_probe, oversample, 1)
    n_rand = max(min(n_rand, limit - n_probe), 0) if limit > n_probe else 0
    gauss = torch.randn(d_in, n_rand, generator=generator)
    return gauss if probe is None else torch.cat([probe.float(), gauss], dim=1)
