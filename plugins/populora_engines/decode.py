"""The ``hf`` engine's own decode loop: a static KV cache, finished rows dropped, per-row counter-based sampling.

``transformers.generate`` at the nano model's scale spends most of a step outside the model's arithmetic:
its ``DynamicCache`` concatenates every layer's keys and values at every token (the whole cache copied per
token), and rows that finished or are left padding keep being computed until the longest row ends. Here:

* keys and values go into buffers preallocated for prompt + ``max_tokens`` (written in place); attention reads
  only the filled part;
* when a quarter of the rows have finished, the buffers, the masks and the per-row LoRA weights are narrowed
  to the live rows, and leading columns that are padding in every live row are cut off;
* sampling draws each row's token by inverse CDF from one uniform per (row, token) made by a counter-based hash
  of the row's key and the token index: a row's samples depend on its key alone, not on its batch, the
  batch's order, compaction or the device;
* a row's arithmetic does not depend on its batch either (on one CPU): its columns are shifted by multiples of
  ALIGN only, each row writes its own next column, attention reads multiples of WIDTH columns, its prompt is
  attended over its own columns, and every GEMM has at least MIN_ROWS rows, so a call split across workers
  or threads gives the single process's tokens and log-probs bit for bit.

The prompt runs through the model's ordinary forward (``past_key_values`` is an object with the Cache
``update`` method; the 4D boolean mask is passed as prepared, which transformers uses as is), so the model's
own layers, RoPE and the LoRA hooks are those of a training forward. The one-token steps after it run
through :class:`~populora_engines.fused.FusedStep` where it applies (Llama, Qwen2, Mistral): the same ops on
the same weights, bit for bit the forward, without transformers' per-module machinery, which was most of a
small model's step; elsewhere through the forward. Models with sliding-window layers use ``generate``
instead (:func:`supported`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from populora_core.api.rng import hashed_seed

from . import fused as fused_decode
from .numerics import ALIGN, MIN_ROWS, WIDTH, attend

_M32 = 0xFFFF_FFFF
# odd multipliers below 2**31, so x * m of a 32-bit x stays inside int64 (no signed overflow)
_MULTIPLIERS = (0x7FEB352D, 0x5BD1E995, 0x1B873593)


def row_key(*parts: object) -> int:
    """A 32-bit sampling key for one row (e.g. call seed, request index, sample index)."""
    return hashed_seed(*parts, bits=32)


def _hash32(x: Any) -> Any:
    """A 32-bit integer mix (xorshift-multiply rounds), elementwise over an int64 tensor of 32-bit values."""
    for m in _MULTIPLIERS:
        x = x ^ (x >> 16)
        x = (x * m) & _M32
    return x ^ (x >> 16)


def uniforms(keys: Any, steps: int | list[int]) -> Any:
    """float64 uniforms in (0, 1), each a pure function of (key, step): one per row for token ``steps``, or
    (rows, len(steps)) for a list of token indices (the decode loop draws a call's table at once: integer
    ops elementwise, the same values as step by step, for a few ops per call instead of ~40 per step)."""
    step = keys.new_tensor(steps) & _M32
    keys = keys if step.dim() == 0 else keys[:, None]
    x = _hash32(keys ^ _hash32(step))
    x = _hash32(x ^ ((keys * 0x2C1B3C6D) & _M32))
    return (x.double() + 0.5) / 2.0**32


def sample(logits: Any, temperature: float, top_p: float, u: Any) -> Any:
    """Token per row from float32 ``logits`` (rows, vocab): greedy at temperature 0, else inverse CDF with ``u``.

    top-p keeps the fewest most probable tokens whose mass reaches ``top_p`` (at least one), as transformers'
    ``TopPLogitsWarper`` does, and samples among them in proportion to their probabilities. The target
    ``u x mass`` is below the last CDF value (u <= 1 - 2**-33), so a zero-probability token is never drawn.
    """
    import torch

    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        above = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked before each one
        probs = probs.masked_fill(above >= top_p, 0.0)
    cdf = probs.cumsum(dim=-1)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1)).squeeze(1)
    return pick if order is None else order.gather(1, pick.unsqueeze(1)).squeeze(1)


ATTENTION = "populora_decode"

#: during a prefill, each row's prompt columns (start, end); set per thread by :func:`_prefill`
_PROMPT_SPANS: ContextVar[list[tuple[int, int]] | None] = ContextVar("populora_prompt_spans", default=None)


def _decode_attention(
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None, **kwargs: Any
) -> tuple[Any, None]:
    """Attention of one new token per row as two plain matmuls (the query heads of one KV head together).

    At decode shapes SDPA's CPU flash kernel costs about twice this. A prompt (several query tokens) goes to
    SDPA one row at a time, over that row's prompt columns only (:data:`_PROMPT_SPANS`): SDPA's rounding
    depends on the width it reduces over and not only on positions mod ALIGN, so a prompt is attended as it
    is alone. Same signature and output layout as transformers' ``sdpa_attention_forward``.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dim = query.shape[-1]
    if query.shape[2] != 1:
        spans = _PROMPT_SPANS.get()
        if spans is None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        rows, heads, width, _ = query.shape
        # padding queries get zeros: their outputs only reach padding columns, masked for every real query
        out = query.new_zeros(rows, width, heads, dim)
        for r, (a, b) in enumerate(spans):
            span = slice(a, b)
            out[r, span] = sdpa_attention_forward(
                module,
                query[r : r + 1, :, span].contiguous(),
                key[r : r + 1, :, span].contiguous(),
                value[r : r + 1, :, span].contiguous(),
                attention_mask[r : r + 1, :, span, span].contiguous(),
                scaling=scaling,
                **kwargs,
            )[0][0]
        return out, None
    masked_out = ~attention_mask[:, :, :, : key.shape[2]]
    return attend(query, key, value, masked_out, dim**-0.5 if scaling is None else scaling), None


def decode_attention_name() -> str:
    """:data:`ATTENTION`, registered with transformers' ``AttentionInterface`` (what a serving block asks for)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _decode_attention)
    return ATTENTION


@contextmanager
def decode_attention(model: Any) -> Iterator[None]:
    """Within the block, ``model``'s attention layers use :func:`_decode_attention`. The shared base is already
    so configured by its host's serving block (``ModelHost.serving(attention=...)``, its owner); a model of the
    caller's own is configured here for the block."""
    config = model.config
    before = config._attn_implementation
    if before == ATTENTION:
        yield
        return
    config._attn_implementation = decode_attention_name()
    try:
        yield
    finally:
        config._attn_implementation = before


class StaticKV:
    """Preallocated keys and values per layer, (rows, kv heads, columns, head dim); the Cache ``update`` API.

    The prefill writes its columns at once; after it (:meth:`start`) each one-token step writes row r at its
    own column ``cols[r]`` (a row's columns follow its prompt, whatever the other rows' widths). Attention
    reads ``width`` columns, a multiple of WIDTH, so that a row's reductions round as they do alone.
    Zero-initialised: a column a row never wrote is masked, and 0 x NaN from ``torch.empty`` would poison it.
    """

    def __init__(self, capacity: int) -> None:
        self.keys: dict[int, Any] = {}
        self.values: dict[int, Any] = {}
        self.capacity = -(-capacity // WIDTH) * WIDTH
        self.cols: Any = None  # per row, the column its next token goes to (None during the prefill)
        self.rows: Any = None  # arange over the rows, for the per-row writes
        self.end = 0  # 1 + the last column any row writes at this step

    @property
    def width(self) -> int:
        """Columns attention reads: those up to ``end``, rounded up to a multiple of WIDTH."""
        return min(self.capacity, -(-self.end // WIDTH) * WIDTH)

    def start(self, cols: Any) -> None:
        """From the prefill to one-token steps: row r's first token goes to column ``cols[r]``."""
        import torch

        self.cols = cols
        self.rows = torch.arange(len(cols), device=cols.device)
        self.end = int(cols.max()) + 1

    def advance(self) -> None:
        self.cols = self.cols + 1
        self.end += 1

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        import torch

        if layer_idx not in self.keys:
            rows, heads, _, dim = key_states.shape
            shape = (rows, heads, self.capacity, dim)
            self.keys[layer_idx] = torch.zeros(shape, dtype=key_states.dtype, device=key_states.device)
            self.values[layer_idx] = torch.zeros(shape, dtype=value_states.dtype, device=value_states.device)
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if self.cols is None:  # the prefill: every row's columns [0, width of the prompts)
            end = key_states.shape[2]
            k[:, :, :end] = key_states
            v[:, :, :end] = value_states
            return k[:, :, :end], v[:, :, :end]
        k[self.rows, :, self.cols] = key_states[:, :, 0]
        v[self.rows, :, self.cols] = value_states[:, :, 0]
        return k[:, :, : self.width], v[:, :, : self.width]

    def narrow(self, rows: Any, first_column: int) -> None:
        """Keep rows ``rows`` and the columns from ``first_column`` (a multiple of WIDTH) on (contiguous copies)."""
        assert first_column % WIDTH == 0
        for store in (self.keys, self.values):
            for layer, t in store.items():
                store[layer] = t[rows, :, first_column:].contiguous()
        self.capacity -= first_column
        self.start(self.cols[rows] - first_column)


@dataclass
class Decoded:
    tokens: list[list[int]]  # per row, up to and including EOS
    logprobs: list[list[float]] | None  # raw-distribution log-prob of each token, when asked


def decode(
    model: Any,
    prompts: list[list[int]],
    keys: list[int],
    *,
    max_tokens: int,
    temperature: float,
    top_p: float,
    eos_ids: list[int],
    pad_id: int,
    device: str,
    row_adapters: Any = None,
    logprobs: bool = False,
    stopped: Any = None,
    narrow_at: float = 0.75,
    prefill_row: list[int] | None = None,
    fused: bool | None = None,
) -> Decoded:
    """Generate up to ``max_tokens`` per row; a row ends at an EOS id or when ``stopped(row, tokens)`` is true.

    ``keys``: each row's sampling key (:func:`row_key`). ``row_adapters``: the call's
    :class:`~populora_engines.batched_lora.RowAdapters`, narrowed along with the rows. When the unfinished
    rows are at most ``narrow_at`` of the rows in the batch, the batch is narrowed to them.
    ``prefill_row``: per row, a row with the same prompt and adapter (e.g. the first of a request's ``n``
    samples): each distinct prompt then runs once and its keys, values and logits are copied to its rows.
    ``fused``: the steps after the prefill through :class:`~populora_engines.fused.FusedStep` (True; an error
    where it does not apply), the model's forward (False), or the fused step wherever it applies (None).
    """
    import torch

    with decode_attention(model):
        step = fused_decode.fused_step(model) if fused is not False else None
        if fused and step is None:
            raise ValueError(f"the fused decode step does not apply to this {type(model).__name__} call")
        n = len(prompts)
        filler = max(0, MIN_ROWS - n)  # rows decoded only to fill a step up to MIN_ROWS (copies of row 0)
        if filler:
            prompts, keys = prompts + [prompts[0]] * filler, keys + [keys[0]] * filler
            prefill_row = (prefill_row or list(range(n))) + [prefill_row[0] if prefill_row else 0] * filler
            if row_adapters is not None:
                row_adapters.select(torch.tensor(list(range(n)) + [0] * filler, dtype=torch.long, device=device))
            n += filler
        firsts = sorted(set(prefill_row)) if prefill_row is not None else list(range(n))
        # the prefill too computes at least MIN_ROWS rows (its lm_head has one per row)
        firsts += [firsts[0]] * max(0, MIN_ROWS - len(firsts))
        shared = firsts != list(range(n))
        if row_adapters is not None and shared:
            row_adapters.select(torch.tensor(firsts, dtype=torch.long, device=device))
        kv, valid, next_pos, logits = _prefill(model, [prompts[f] for f in firsts], max_tokens, pad_id, device)
        if shared:
            assert prefill_row is not None
            spread = torch.tensor([firsts.index(f) for f in prefill_row], dtype=torch.long, device=device)
            kv.narrow(spread, 0)
            valid, next_pos, logits = valid[spread], next_pos[spread], logits[spread]
            if row_adapters is not None:
                row_adapters.select(spread)
        eos = torch.tensor(sorted(set(eos_ids)) or [-1], dtype=torch.long, device=device)
        draws = uniforms(torch.tensor(keys, dtype=torch.long, device=device), list(range(max_tokens)))
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] | None = [[] for _ in range(n)] if logprobs else None
        rows = list(range(n))  # the original row of each current row
        running = [i < n - filler for i in range(n)]  # per current row: not finished (fillers never run)
        for t in range(max_tokens):
            chosen = sample(logits, temperature, top_p, draws[:, t])
            hit_eos = torch.isin(chosen, eos).tolist()
            chosen_list = chosen.tolist()
            if logps is not None:
                chosen_logp = torch.log_softmax(logits, dim=-1).gather(1, chosen.unsqueeze(1)).squeeze(1).tolist()
            for i, row in enumerate(rows):
                if not running[i]:
                    continue
                tokens[row].append(chosen_list[i])
                if logps is not None:
                    logps[row].append(chosen_logp[i])
                if hit_eos[i] or (stopped is not None and stopped(row, tokens[row])):
                    running[i] = False
            if t + 1 == max_tokens or not any(running):
                break
            valid[kv.rows, kv.cols] = True  # the chosen tokens' columns (finished rows compute padding for themselves)
            live = sum(running)
            if live <= narrow_at * len(rows) and max(live, MIN_ROWS) < len(rows):
                keep_list = [i for i, r in enumerate(running) if r]
                done = [i for i, r in enumerate(running) if not r]
                keep_list = sorted(keep_list + done[: max(0, MIN_ROWS - live)])  # finished rows as fillers
                keep = torch.tensor(keep_list, dtype=torch.long, device=device)
                # columns that are padding in every kept row are dropped too (positions are explicit), as
                # many as keep the widths multiples of WIDTH (and so the columns' positions mod ALIGN)
                first = int((~valid[keep, : kv.width]).all(dim=0).long().cumprod(dim=0).sum()) // WIDTH * WIDTH
                kv.narrow(keep, first)
                valid = valid[keep, first:]
                chosen, next_pos, draws = chosen[keep], next_pos[keep], draws[keep]
                rows, running = [rows[i] for i in keep_list], [running[i] for i in keep_list]
                if row_adapters is not None:
                    row_adapters.select(keep)
            mask = valid[:, None, None, : kv.width]
            if step is not None:
                logits = step(chosen.unsqueeze(1), mask, next_pos.unsqueeze(1), kv)
            else:
                out = model(
                    input_ids=chosen.unsqueeze(1),
                    attention_mask=mask,
                    position_ids=next_pos.unsqueeze(1),
                    past_key_values=kv,
                    use_cache=False,
                    logits_to_keep=1,
                )
                logits = out.logits[:, -1, :].float()
            kv.advance()
            next_pos = next_pos + 1
        real = n - filler
        return Decoded(tokens[:real], logps[:real] if logps is not None else None)


def _prefill(model: Any, prompts: list[list[int]], max_tokens: int, pad_id: int, device: str) -> tuple[Any, ...]:
    """Prompts through the model: (cache, valid columns, next positions, last logits).

    Row r's prompt (length L_r, the widest W) starts at P_r = ALIGN x floor((W - L_r) / ALIGN), the largest
    multiple of ALIGN that fits, so its columns sit where they do alone mod ALIGN; the columns from its end
    e_r = P_r + L_r to W (fewer than ALIGN) are a masked gap, overwritten by its first tokens.
    """
    import torch

    # at least MIN_ROWS columns: the batched LoRA's per-row products have one GEMM row per column
    n, width = len(prompts), max(MIN_ROWS, *(len(p) for p in prompts))
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    kv = StaticKV(width + max_tokens)
    valid = torch.zeros((n, kv.capacity), dtype=torch.bool)  # the columns each row attends to
    spans = []
    for r, p in enumerate(prompts):
        start = (width - len(p)) // ALIGN * ALIGN
        spans.append((start, start + len(p)))
        ids[r, start : start + len(p)] = torch.tensor(p, dtype=torch.long)
        valid[r, start : start + len(p)] = True
    valid = valid.to(device)
    positions = (valid[:, :width].long().cumsum(dim=1) - 1).clamp(min=0)
    ends = torch.tensor([b for _, b in spans], dtype=torch.long, device=device)
    # logits of the columns from the earliest prompt end on, as an index tensor: the lm_head then reads a
    # contiguous gather (an int slices a strided view, whose GEMM can round otherwise for a few rows)
    keep = torch.arange(min(b for _, b in spans) - 1, width, device=device)
    # causal over real tokens; a padding query attends to itself only (a fully masked row would be NaN)
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    diagonal = torch.eye(width, dtype=torch.bool, device=device)
    token = _PROMPT_SPANS.set(spans)
    try:
        out = model(
            input_ids=ids.to(device),
            attention_mask=((causal & valid[:, None, :width]) | diagonal)[:, None],
            position_ids=positions,
            past_key_values=kv,
            use_cache=False,
            logits_to_keep=keep,
        )
    finally:
        _PROMPT_SPANS.reset(token)
    kv.start(ends)
    last = out.logits[torch.arange(n, device=device), ends - 1 - keep[0]].float()
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)
    return kv, valid, lengths, last
