"""Requests in, completions out, the same way in both engines: prompts tokenized, sampling checked, completions cut
at stop strings, dropped requests answered."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from populora_core.api import UserError
from populora_core.api.components import Completion, GenerationRequest, SamplingParams


def check_sampling(sampling: SamplingParams) -> None:
    if sampling.n < 1:
        raise UserError(f"sampling.n must be >= 1, got {sampling.n}")
    if sampling.max_tokens < 1:
        raise UserError(f"sampling.max_tokens must be >= 1, got {sampling.max_tokens}")
    if sampling.temperature < 0:
        raise UserError(f"sampling.temperature must be >= 0, got {sampling.temperature}")
    if not 0 < sampling.top_p <= 1:
        raise UserError(f"sampling.top_p must be in (0, 1], got {sampling.top_p}")
    if sampling.max_prompt_tokens is not None and sampling.max_prompt_tokens < 1:
        raise UserError(f"sampling.max_prompt_tokens must be >= 1 or None, got {sampling.max_prompt_tokens}")


def not_generated(prompt_token_ids: list[int], n: int, reason: str) -> list[Completion]:
    """The ``n`` completions of a request the engine did not generate for (``reason``: a DROPPED one)."""
    return [Completion("", [], [], list(prompt_token_ids), reason) for _ in range(n)]


def encode_prompts(tokenizer: Any, requests: Sequence[GenerationRequest], chat_template: bool) -> list[list[int]]:
    """Prompt token ids exactly as both engines feed them (the vllm engine passes ids, not text)."""
    out = []
    for req in requests:
        if chat_template:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": req.prompt}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            out.append([int(i) for i in ids])
        else:
            out.append([int(i) for i in tokenizer(req.prompt)["input_ids"]])
        if not out[-1]:
            raise UserError(f"request {len(out) - 1}: the prompt encodes to zero tokens")
    return out


def cut_completion(
    tokenizer: Any, tokens: list[int], eos_ids: set[int], stop: Sequence[str], max_tokens: int
) -> tuple[list[int], str, str]:
    """(kept token ids, text, finish_reason), vLLM's convention.

    EOS ends a completion and stays in the ids (not in the text); a stop string ends it at the token
    that completed it, the ids keep that token, the text ends before the stop string.
    """
    end = len(tokens)
    reason = "length" if len(tokens) >= max_tokens else "stop"
    for i, t in enumerate(tokens):
        if t in eos_ids:
            end, reason = i + 1, "stop"
            break
    tokens = tokens[:end]
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    if stop:
        hit = _first_stop(text, stop)
        if hit is not None:
            k = len(tokens)
            for k in range(1, len(tokens) + 1):  # the first prefix whose text holds a stop string
                if _first_stop(tokenizer.decode(tokens[:k], skip_special_tokens=True), stop) is not None:
                    break
            tokens = tokens[:k]
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            text = text[: _first_stop(text, stop)]
            reason = "stop"
    return tokens, text, reason


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(found) if found else None
