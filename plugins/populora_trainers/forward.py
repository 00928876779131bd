"""The fused LoRA forward of a training step (installed by the host), and when gradient checkpointing is on."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

_SELECTED = threading.local()  # the adapter this thread's fused forwards add, when a block fuses several
_CAST = threading.local()  # this thread's last input cast to the adapters' dtype (weak references): _cast


@contextmanager
def fused_adapter(name: str) -> Iterator[None]:
    """In this thread, the fused forwards of a :func:`fused_lora` block over several adapters add ``name``."""
    previous = getattr(_SELECTED, "name", None)
    _SELECTED.name = name
    try:
        yield
    finally:
        _SELECTED.name = previous


def fused_layer_forward(adapters: str | Sequence[str]) -> Callable[[Any], Callable[..., Any] | None]:
    """For ``ModelHost.training(layer_forward=...)``: a LoRA layer's forward that adds ``((x A^T) s) B^T`` of an
    adapter to the base output in one ``addmm``.

    PEFT's layer computes ``base(x) + lora_B(lora_A(x)) * s``: the rank-r product, the scaling and the sum are
    three passes over the (tokens, d_out) output, and the rank-8 matmul that writes it runs at a few
    GFLOP/s on the CPU; together about a third of a nano update. Here the scaling goes on the (tokens, r)
    factor and the product is accumulated into the base output. The same parameters get the gradients
    (the same values up to fp32 rounding). With several ``adapters`` (members trained at once, all of them
    active), each thread names its own with :func:`fused_adapter`. A layer with dropout, DoRA or a bias on the
    adapters, or not over a ``Linear``, keeps PEFT's forward (None); one whose adapters are off (the KL
    reference) or not these runs PEFT's, checked at every call.
    """
    import torch

    names = [adapters] if isinstance(adapters, str) else list(adapters)

    def layer_forward(module: Any) -> Callable[..., Any] | None:
        lora_a = module.lora_A
        if any(name not in lora_a or not isinstance(module.lora_dropout[name], torch.nn.Identity) for name in names):
            return None
        if any(module.use_dora.get(n, False) or getattr(module, "lora_bias", {}).get(n, False) for n in names):
            return None
        if not isinstance(module.get_base_layer(), torch.nn.Linear):
            return None
        return _fused_forward(module, names)

    return layer_forward


def _fused_forward(module: Any, names: list[str]) -> Callable[..., Any]:
    import torch

    peft_forward = type(module).forward.__get__(module)
    base = module.get_base_layer()
    factors = {n: (module.lora_A[n].weight, module.lora_B[n].weight, module.scaling[n]) for n in names}
    only = names[0] if len(names) == 1 else None

    def forward(x: Any, *args: Any, **kwargs: Any) -> Any:
        if module.disable_adapters or module.merged or list(module.active_adapters) != names or args or kwargs:
            return peft_forward(x, *args, **kwargs)
        name = only or getattr(_SELECTED, "name", None)
        if name not in factors:
            raise RuntimeError(f"fused LoRA forward over {names}: this thread selected {name!r} (fused_adapter)")
        lora_a, lora_b, scale = factors[name]
        result = base(x)
        low = torch.nn.functional.linear(_cast(x, lora_a.dtype), lora_a) * scale
        if result.dtype != low.dtype:
            return result + torch.nn.functional.linear(low, lora_b).to(result.dtype)
        flat = torch.addmm(result.reshape(-1, result.shape[-1]), low.reshape(-1, low.shape[-1]), lora_b.t())
        return flat.view(result.shape)

    return forward


def _cast(x: Any, dtype: Any) -> Any:
    """``x`` in the adapters' dtype, cast once per input: q/k/v (and gate/up) read one tensor, and autograd keeps
    each module's cast for backward (at 14k tokens about 0.8 GiB a 7B layer per extra copy). The same tensor,
    unchanged since (its version counter), gets the cast made for the module before it in this thread, while that
    cast lives: held by weak references, so the cache keeps nothing alive (no grad: each module casts again)."""
    if x.dtype == dtype:
        return x
    if x.is_inference():  # no version counter to check (and nothing kept for backward)
        return x.to(dtype)
    last = getattr(_CAST, "last", None)
    if last is not None and last[0]() is x and last[1] == x._version:
        cast = last[2]()
        if cast is not None and cast.dtype == dtype:
            return cast
    cast = x.to(dtype)
    _CAST.last = (weakref.ref(x), x._version, weakref.ref(cast))
    return cast


def use_checkpointing(setting: str, device: str) -> bool:
    """``gradient_checkpointing``: ``on``, ``off``, or ``auto`` (on for a CUDA device, off on the CPU)."""
    return setting == "on" or (setting == "auto" and str(device).startswith("cuda"))


#: ``long_row_tokens: auto`` on CUDA: from here on a row's attention dominates its micro-batch's cost
LONG_ROW_TOKENS = 2048


def long_row_threshold(setting: int | str | None, device: str) -> int | None:
    """``long_row_tokens``: a number, None (off), or ``auto`` (:data:`LONG_ROW_TOKENS` on CUDA, off on the CPU)."""
    if setting == "auto":
        return LONG_ROW_TOKENS if str(device).startswith("cuda") else None
    return None if setting is None else int(setting)
