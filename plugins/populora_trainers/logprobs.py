"""Per-token log-probs (and entropy) of completions: in one piece or in recomputed chunks."""

from __future__ import annotations

from typing import Any


def token_logprobs(
    model: Any,
    batch: dict[str, Any],
    temperature: float,
    entropy: bool = False,
    chunk_tokens: int | None = None,
    joined: bool = False,
) -> tuple[Any, Any]:
    """Per completion token log-prob (and entropy) under ``model``; shape (rows, completion width).

    Position ids come from the attention mask, so a left-padded prompt sees the same positions as in
    generation (transformers' Llama otherwise numbers padded rows from the first pad).

    ``chunk_tokens``: when the micro-batch's rows x completion width exceeds it, the log-probs come from
    :func:`chunked_token_logprobs` (the fp32 ``(rows, width, vocab)`` logits never exist; padded positions
    are 0 there). Otherwise, and with None, the whole micro-batch in one piece, as before the option.
    ``joined``: the decoder runs over each row's prompt and completion back to back, right padded
    (:func:`completion_hidden`), instead of the packed layout's longest prompt + longest completion.
    """
    import torch

    rows, width = batch["completion_ids"].shape
    if chunk_tokens is not None and rows * width > chunk_tokens:
        return chunked_token_logprobs(model, batch, temperature, entropy, chunk_tokens, joined)
    if joined:
        causal = model.get_base_model() if hasattr(model, "get_base_model") else model
        logits = causal.get_output_embeddings()(completion_hidden(causal.get_decoder(), batch, True)).float()
    else:
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        out = model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, logits_to_keep=width + 1, use_cache=False
        )
        logits = out.logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if entropy else None
    return logp, ent


def completion_hidden(decoder: Any, batch: dict[str, Any], joined: bool) -> Any:
    """The decoder's last hidden states at the positions that predict each completion token: (rows, width, d).

    ``joined``: rows laid out as prompt then completion, right padded to the longest row (padding only
    where the row is shorter than the longest prompt + completion of the micro-batch, not where its prompt
    is shorter than the longest prompt and its completion shorter than the longest completion).
    """
    import torch

    prompt_mask, comp_mask = batch["prompt_mask"], batch["completion_mask"]
    width = comp_mask.shape[1]
    if not joined:
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([prompt_mask, comp_mask], dim=1)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        hidden = decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False)
        # the positions that predict the completion tokens (the one-piece path's logits_to_keep=width+1, minus the last)
        return hidden.last_hidden_state[:, -(width + 1) : -1, :]
    plen, clen = prompt_mask.sum(dim=1), comp_mask.sum(dim=1)
    total = plen + clen
    longest = int(total.max())
    rows = prompt_mask.shape[0]
    input_ids = batch["prompt_ids"].new_zeros((rows, longest))
    for r in range(rows):
        p, c = int(plen[r]), int(clen[r])
        input_ids[r, :p] = batch["prompt_ids"][r, prompt_mask.shape[1] - p :]
        input_ids[r, p : p + c] = batch["completion_ids"][r, :c]
    columns = torch.arange(longest, device=input_ids.device)
    mask = (columns[None, :] < total[:, None]).long()
    positions = columns[None, :].expand(rows, -1)
    hidden = decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False)
    # completion token j of row r is predicted at column plen_r + j - 1 (padded j: any column, masked later)
    at = (plen[:, None] - 1 + torch.arange(width, device=input_ids.device)[None, :]).clamp(max=longest - 1)
    state = hidden.last_hidden_state
    return state.gather(1, at[:, :, None].expand(-1, -1, state.shape[-1]))


def chunked_token_logprobs(
    model: Any, batch: dict[str, Any], temperature: float, entropy: bool, chunk_tokens: int, joined: bool = False
) -> tuple[Any, Any]:
    """:func:`token_logprobs` from the decoder's last hidden states, ``chunk_tokens`` completion tokens at a time.

    The decoder runs once; the LM head, the fp32 cast, the temperature, the log-softmax, the gather and the
    entropy then run per chunk of real (unpadded) completion tokens. Each chunk is wrapped in
    ``torch.utils.checkpoint`` (non-reentrant), so autograd keeps only the chunk's hidden states and
    recomputes its logits in backward: forward and backward both hold one chunk's ``(chunk, vocab)`` logits
    at a time. Same values as the one-piece path up to fp32 rounding; padded positions are 0.
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = causal.get_decoder(), causal.get_output_embeddings()
    hidden = completion_hidden(decoder, batch, joined)
    real = batch["completion_mask"].bool()
    h, targets = hidden[real], batch["completion_ids"][real]
    fn = _logp_entropy_function()

    def piece(h_chunk: Any, t_chunk: Any) -> tuple[Any, Any]:
        return fn.apply(head(h_chunk), t_chunk, float(temperature), entropy)

    grad = torch.is_grad_enabled()
    lps, ents = [], []
    for s in range(0, h.shape[0], chunk_tokens):
        h_chunk, t_chunk = h[s : s + chunk_tokens], targets[s : s + chunk_tokens]
        lp, ent = checkpoint(piece, h_chunk, t_chunk, use_reentrant=False) if grad else piece(h_chunk, t_chunk)
        lps.append(lp)
        ents.append(ent)
    zeros = torch.zeros(real.shape, dtype=torch.float32, device=h.device)
    # back into the padded (rows, width) layout, differentiably; padded positions stay 0
    logp = zeros.masked_scatter(real, torch.cat(lps) if lps else zeros[:0, 0])
    ent_out = zeros.masked_scatter(real, torch.cat(ents) if lps else zeros[:0, 0]) if entropy else None
    return logp, ent_out


_LOGP_ENTROPY: Any = None
ROW_BLOCK = 64  # rows of a chunk's (tokens, vocab) logits that the Function's temporaries span at once


def _logp_entropy_function() -> Any:
    """A ``torch.autograd.Function`` (built on first use: no torch at import) for one chunk of logits.

    ``apply(logits (n, vocab), targets (n,), temperature, entropy) -> (logp (n,), entropy (n,) or None)``,
    fp32, with the one-piece path's formulas row by row (fp32 cast, division by the temperature,
    ``log_softmax``, gather, ``-(exp(lp) * lp).sum``). It keeps one fp32 ``(n, vocab)`` log-softmax, filled
    and used ``ROW_BLOCK`` rows at a time so that the cast, the temperature and the exp never span the whole
    chunk, and saves only it for backward, which writes the logits' gradient
    (``(g_lp * onehot - p * (g_lp + g_ent * (lp + H))) / T``) into one buffer the same way. Autograd's own
    chain (cast, div, log_softmax, exp, mul, sum) would hold several ``(n, vocab)`` tensors instead.
    """
    global _LOGP_ENTROPY
    if _LOGP_ENTROPY is not None:
        return _LOGP_ENTROPY
    import torch

    class LogpEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, logits: Any, targets: Any, temperature: float, entropy: bool) -> Any:
            ctx.set_materialize_grads(False)
            n = logits.shape[0]
            logp_all = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
            ent = torch.empty(n, dtype=torch.float32, device=logits.device) if entropy else None
            for s in range(0, n, ROW_BLOCK):
                z = logits[s : s + ROW_BLOCK].float()
                if temperature != 1.0:
                    z = z / temperature
                block = logp_all[s : s + ROW_BLOCK]
                torch.log_softmax(z, dim=-1, out=block)
                if ent is not None:
                    ent[s : s + ROW_BLOCK] = -(block.exp() * block).sum(-1)
            logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            ctx.save_for_backward(logp_all, targets, ent)
            ctx.temperature = temperature
            ctx.logits_dtype = logits.dtype
            return logp, ent

        @staticmethod
        def backward(ctx: Any, g_logp: Any, g_ent: Any) -> Any:
            logp_all, targets, ent = ctx.saved_tensors
            if g_logp is None and g_ent is None:
                return None, None, None, None
            grad = torch.empty(logp_all.shape, dtype=ctx.logits_dtype, device=logp_all.device)
            g_lp = None if g_logp is None else g_logp.float().unsqueeze(-1)
            g_h = None if g_ent is None else g_ent.float().unsqueeze(-1)
            for s in range(0, logp_all.shape[0], ROW_BLOCK):
                rows = slice(s, s + ROW_BLOCK)
                lp = logp_all[rows]
                if g_h is not None:  # d H / d z_j = -p_j (lp_j + H)
                    block = (lp + ent[rows].unsqueeze(-1)).mul_(g_h[rows])
                    if g_lp is not None:
                        block.add_(g_lp[rows])
                    block.mul_(lp.exp()).neg_()
                else:  # d lp_t / d z_j = onehot_tj - p_j
                    assert g_lp is not None  # g_ent is None here, so g_logp is not (both None returned above)
                    block = lp.exp().mul_(-g_lp[rows])
                if g_lp is not None:
                    block.scatter_add_(-1, targets[rows].unsqueeze(-1), g_lp[rows])
                if ctx.temperature != 1.0:
                    block.div_(ctx.temperature)
                grad[rows] = block
            return grad, None, None, None

    _LOGP_ENTROPY = LogpEntropy
    return LogpEntropy
