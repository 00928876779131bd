"""What the decode loop, the fused decode step and the batched LoRA agree on so that a row's arithmetic does not
depend on its batch: the fewest rows of a GEMM, the column alignment, the attention of one query token, and
which models the decode loop applies to. One module both import, so neither imports the other for it."""

from __future__ import annotations

from typing import Any


def supported(model: Any) -> bool:
    """Whether the decode loop applies: every layer attends over the full context (no sliding windows)."""
    config = getattr(model, "config", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(t == "full_attention" for t in layer_types)
    return not getattr(config, "use_sliding_window", False)


#: fewest rows a decode step computes. CPU GEMM kernels (MKL / oneDNN) take other code paths for a few rows,
#: so a row's result would depend on how many rows share its step (16 covers AVX2 and AVX-512 at nano's shapes;
#: the measurements and what MKL_CBWR does to this: populora_engines/README.md). A batch is filled up to this
#: with copies of its first row, and narrowing keeps finished rows to this count, a prefill to this many rows
#: and columns (the batched LoRA's per-row products have a GEMM row per column). With ALIGN and WIDTH below
#: and the prompts attended row by row, a row's tokens and log-probs are those it gets alone, whatever its batch.
MIN_ROWS = 16

#: a row's columns are shifted only by multiples of ALIGN, and the decode attention reads a multiple of WIDTH
#: columns: measured (1 thread, AVX2), its reductions over columns then round as for the row alone, while
#: shifts of 2 or 3 mod 4 do not, nor a read of 8 columns against one of 16 (tiny model, head dim 16). SDPA
#: (the prompts) rounds by its total width too, even past 8 masked columns, hence the prompts row by row.
ALIGN = 8
WIDTH = 16


def attend(query: Any, key: Any, value: Any, masked_out: Any, scaling: float) -> Any:
    """One query token per row over ``key``/``value`` (rows, kv heads, columns, dim); (rows, 1, heads, dim)."""
    import torch

    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    q = query.reshape(rows, kv_heads, heads // kv_heads, dim)  # query heads grouped by their KV head
    scores = torch.matmul(q, key.transpose(-1, -2)) * scaling
    scores = scores.masked_fill(masked_out, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(value.dtype)
    out = torch.matmul(probs, value).reshape(rows, heads, 1, dim)
    return out.transpose(1, 2).contiguous()
