"""Synthetic, trained-looking LoRA adapters for tests and benchmarks (no model, no data).

A trained adapter's delta W has a decaying spectrum and is stored in an unbalanced gauge: A keeps
roughly its Kaiming-init scale, B carries the magnitude. Random Gaussian factors would have a flat
spectrum and make truncation errors unrepresentative, so we build U diag(S) V^T with S_i = s0 *
decay^i and hide it behind a random invertible r x r mixing matrix.
"""

from __future__ import annotations

import torch

from populora_core.api.lora import LoraFactors, LoraWeights

#: Qwen2.5-7B: hidden 3584, intermediate 18944, 28 layers, 28 query heads / 4 KV heads of 128.
QWEN25_7B_SHAPES: dict[str, tuple[int, int]] = {  # module -> (d_out, d_in)
    "self_attn.q_proj": (3584, 3584),
    "self_attn.k_proj": (512, 3584),
    "self_attn.v_proj": (512, 3584),
    "self_attn.o_proj": (3584, 3584),
    "mlp.gate_proj": (18944, 3584),
    "mlp.up_proj": (18944, 3584),
    "mlp.down_proj": (3584, 18944),
}


def module_names(layers: int, shapes: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """PEFT's key prefix for a causal LM: ``base_model.model.model.layers.{i}.{module}``."""
    return {f"base_model.model.model.layers.{i}.{m}": s for i in range(layers) for m, s in shapes.items()}


def trained_like(
    shapes: dict[str, tuple[int, int]],
    rank: int,
    alpha: float,
    seed: int,
    *,
    decay: float = 0.8,
    top: float = 0.02,
    dtype: torch.dtype = torch.float32,
) -> LoraWeights:
    """delta W per module = U diag(S) V^T, S_i = top * 0.02 * sqrt(d_out) * decay^i (x U(1, 1.1)):
    about ``top`` of the spectral norm of a base weight of std 0.02, random singular bases."""
    gen = torch.Generator().manual_seed(seed)
    scale = alpha / rank
    modules = {}
    for name, (d_out, d_in) in shapes.items():
        u, _ = torch.linalg.qr(torch.randn(d_out, rank, generator=gen))
        v, _ = torch.linalg.qr(torch.randn(d_in, rank, generator=gen))
        s = top * d_out**0.5 * 0.02 * decay ** torch.arange(rank, dtype=torch.float32)
        s = s * (1.0 + 0.1 * torch.rand(rank, generator=gen))
        mix = torch.eye(rank) + 0.3 * torch.randn(rank, rank, generator=gen) / rank**0.5
        a = mix @ v.T * (rank / 3.0) ** 0.5 / rank**0.5  # A rows ~ Kaiming-uniform norm (~0.58)
        # scale * B @ A = U diag(s) V^T  =>  B = U diag(s) (mix @ V^T rows scaled)^+ / scale
        b = (u * s) @ torch.linalg.pinv(a @ v) / scale
        modules[name] = LoraFactors(a.to(dtype).contiguous(), b.to(dtype).contiguous(), scale)
    config = {
        "r": rank,
        "lora_alpha": alpha,
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "target_modules": sorted({n.rsplit(".", 1)[-1] for n in shapes}),
        "bias": "none",
        "lora_dropout": 0.0,
        "use_rslora": False,
        "use_dora": False,
    }
    return LoraWeights(modules, config)
