"""Rollouts into micro-batches (by rows or a token budget) and padded tensors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from populora_core.api.components import Rollout


def micro_batches(
    rows: Sequence[Any],
    size: int,
    tokens: int | None = None,
    same: Callable[[Any], Any] | None = None,
    joined: bool = False,
    alone_from: int | None = None,
) -> list[list[Any]]:
    """Consecutive runs of ``rows`` (tuples whose first item is a Rollout), in the given order.

    ``tokens`` None: at most ``size`` rows per micro-batch. Otherwise a micro-batch takes the next row while its
    packed shape (rows x (longest prompt + longest completion), padding counted as :func:`pack` lays it out;
    ``joined``: rows x longest prompt + completion, as :func:`completion_hidden` lays it out) stays within
    ``tokens``; a row longer than that goes alone. ``same``: a key that every row of one micro-batch shares
    (grpo: the prompt length). ``alone_from``: a row of at least this many tokens (prompt + completion) gets a
    micro-batch of its own (unpadded: SDPA's unmasked kernel), the rows around it keep their order.
    """
    groups: list[list[Any]] = []
    pmax = lmax = 0
    sealed = False  # the last micro-batch holds a long row: nothing joins it
    for row in rows:
        r = row[0]
        p, c = len(r.prompt_token_ids), max(1, len(r.completion_token_ids))
        if joined:  # one length: prompt + completion back to back
            p, c = p + c, 0
        alone = alone_from is not None and p + c >= alone_from
        if groups and not alone and not sealed and (same is None or same(groups[-1][0]) == same(row)):
            g = groups[-1]
            wp, wl = max(pmax, p), max(lmax, c)
            if (len(g) < max(1, size)) if tokens is None else ((len(g) + 1) * (wp + wl) <= tokens):
                g.append(row)
                pmax, lmax = wp, wl
                continue
        groups.append([row])
        pmax, lmax, sealed = p, c, alone
    return groups


def pack(rows: Sequence[Rollout], pad_id: int, device: str) -> dict[str, Any]:
    """Prompts left padded, completions right padded (TRL's layout), plus RoPE positions from the mask."""
    import torch

    pmax = max(len(r.prompt_token_ids) for r in rows)
    lmax = max(1, max(len(r.completion_token_ids) for r in rows))
    n = len(rows)
    prompt_ids = torch.full((n, pmax), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, pmax), dtype=torch.long)
    comp_ids = torch.full((n, lmax), pad_id, dtype=torch.long)
    comp_mask = torch.zeros((n, lmax), dtype=torch.long)
    for i, r in enumerate(rows):
        p, c = r.prompt_token_ids, r.completion_token_ids
        prompt_ids[i, pmax - len(p) :] = torch.tensor(p, dtype=torch.long)
        prompt_mask[i, pmax - len(p) :] = 1
        if c:
            comp_ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
            comp_mask[i, : len(c)] = 1
    return {
        k: v.to(device)
        for k, v in dict(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=comp_ids, completion_mask=comp_mask
        ).items()
    }
