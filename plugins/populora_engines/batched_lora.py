"""Mixed-adapter LoRA for one ``generate`` call as two batched matmuls per module (punica-style).

PEFT's ``adapter_names`` path loops over the distinct adapters inside every LoRA layer at every
decoding step (index rows, two linears, scatter back): with 8 adapters on a small model that loop,
not the matmuls, is the cost, and a mixed batch ends up barely faster than adapter by adapter. Here
the adapters of a call are stacked once per module (rank padded with zeros, the scale folded into B,
row 0 all zeros for ``__base__`` rows), gathered per batch row once, and every step adds
``bmm(bmm(x, A_row), B_row)`` to the base layer's output through a forward hook while PEFT's own
adapters are disabled. The gathered weights cost rows x (d_in + d_out) x r per module, so the engine
uses this only under a memory budget and falls back to PEFT otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

BASE = "__base__"


def _lora_modules(peft_model: Any, keys: set[str]) -> list[Any]:
    from peft.tuners.lora import LoraLayer

    out = []
    for module in peft_model.modules():
        if isinstance(module, LoraLayer) and any(k in module.lora_A for k in keys):
            out.append(module)
    return out


def supported(peft_model: Any, keys: Sequence[str]) -> bool:
    """Plain LoRA on linear layers only (no DoRA, no embedding/conv LoRA, no bias)."""
    import torch

    names = {k for k in keys if k != BASE}
    for k in names:
        cfg = peft_model.peft_config.get(k)
        if cfg is None or getattr(cfg, "use_dora", False) or getattr(cfg, "lora_bias", False):
            return False
    for module in _lora_modules(peft_model, names):
        if not isinstance(module.get_base_layer(), torch.nn.Linear):
            return False
    return True


def gathered_bytes(peft_model: Any, keys: Sequence[str]) -> int:
    names = {k for k in keys if k != BASE}
    total = 0
    for module in _lora_modules(peft_model, names):
        base = module.get_base_layer()
        r = max(module.r[k] for k in names if k in module.lora_A)
        total += len(keys) * (base.in_features + base.out_features) * r * 4
    return total


@contextmanager
def batched_adapters(peft_model: Any, keys: Sequence[str]) -> Iterator[None]:
    """Within the block, row i of every forward uses adapter ``keys[i]`` (``__base__``: none)."""
    import torch

    names = sorted({k for k in keys if k != BASE})
    handles = []
    with torch.no_grad():
        for module in _lora_modules(peft_model, set(names)):
            base = module.get_base_layer()
            weight = base.weight
            r = max(module.r[k] for k in names if k in module.lora_A)
            a = torch.zeros(len(names) + 1, base.in_features, r, dtype=torch.float32, device=weight.device)
            b = torch.zeros(len(names) + 1, r, base.out_features, dtype=torch.float32, device=weight.device)
            for j, k in enumerate(names, start=1):
                if k in module.lora_A:
                    rk = module.r[k]
                    a[j, :, :rk] = module.lora_A[k].weight.float().t()
                    b[j, :rk, :] = module.lora_B[k].weight.float().t() * module.scaling[k]
            index = torch.tensor([0 if k == BASE else names.index(k) + 1 for k in keys], device=weight.device)
            a_rows = a[index].to(weight.dtype)
            b_rows = b[index].to(weight.dtype)

            def hook(mod: Any, args: Any, output: Any, a_rows: Any = a_rows, b_rows: Any = b_rows) -> Any:
                x = args[0]
                if x.dim() != 3 or x.shape[0] != a_rows.shape[0]:
                    raise RuntimeError(f"batched LoRA expects (rows={a_rows.shape[0]}, T, d) inputs, got "
                                       f"{tuple(x.shape)}")
                return output + torch.bmm(torch.bmm(x.to(a_rows.dtype), a_rows), b_rows).to(output.dtype)

            handles.append(module.register_forward_hook(hook))
    try:
        with peft_model.disable_adapter():
            yield
    finally:
        for h in handles:
            h.remove()
