"""The decode loop's one-token step for Llama-family models in plain torch ops, bit for bit the model's forward.

At the nano model about 2 ms of a 6.5 ms one-row decode step through the model's forward is transformers'
module machinery (decorators, kwargs handling, output capture, mask preparation, module calls and their
hooks), not arithmetic. :class:`FusedStep` runs the same ops in the same order, dtypes and shapes on
the model's own weight tensors, and adds each row's LoRA delta right after each base linear, where the
serving hooks (``batched_lora.serving``) would have added it. It calls no module, so no hook fires: the
deltas come from the :class:`~populora_engines.batched_lora.RowAdapters` those hooks would have read.

:func:`fused_supported` says where that replication holds (Llama, Qwen2 and Mistral as transformers defines
them, full attention, RoPE frequencies fixed at init); :func:`fused_step` also checks the hooks and PEFT
state of one call, and returns None wherever the forward must run instead.
"""

from __future__ import annotations

from typing import Any

from .batched_lora import hooked_rows
from .numerics import attend, supported

_FAMILIES = ("Llama", "Qwen2", "Mistral")
# RoPE types whose forward only reads inv_freq and attention_scaling set at init ("dynamic" and "longrope"
# recompute them from the positions inside the forward)
_STATIC_ROPE = frozenset({"default", "linear", "yarn", "llama3"})


def _of_class(module: Any, name: str) -> bool:
    """``module`` is transformers' own class ``name`` with its own forward (not a subclass, nor a forward
    swapped in from elsewhere, e.g. a hub kernel)."""
    cls = type(module)
    own = cls.__module__.startswith("transformers.models.") and cls.forward.__module__ == cls.__module__
    return cls.__name__ == name and own


def fused_supported(model: Any) -> bool:
    """Whether :class:`FusedStep` replicates ``model``'s forward: a Llama/Qwen2/Mistral causal LM of transformers'
    own module classes, full attention in every layer, a RoPE whose frequencies are fixed at init."""
    import torch

    family = type(model).__name__.removesuffix("ForCausalLM")
    if family not in _FAMILIES or not _of_class(model, f"{family}ForCausalLM") or not supported(model):
        return False
    if family == "Mistral" and getattr(model.config, "sliding_window", None) is not None:
        return False
    inner = model.model
    rotary = inner.rotary_emb
    if not (_of_class(rotary, f"{family}RotaryEmbedding") and rotary.rope_type in _STATIC_ROPE):
        return False
    embed = inner.embed_tokens
    if type(embed) is not torch.nn.Embedding or embed.max_norm is not None:
        return False
    if not _of_class(inner, f"{family}Model") or not _of_class(inner.norm, f"{family}RMSNorm"):
        return False
    return all(
        _of_class(layer, f"{family}DecoderLayer")
        and _of_class(layer.self_attn, f"{family}Attention")
        and _of_class(layer.mlp, f"{family}MLP")
        and _of_class(layer.input_layernorm, f"{family}RMSNorm")
        and _of_class(layer.post_attention_layernorm, f"{family}RMSNorm")
        and isinstance(layer.mlp.act_fn, torch.nn.Module)
        for layer in inner.layers
    )


def _base_linear(module: Any) -> Any:
    """The ``nn.Linear`` whose output is ``module``'s: itself, or the base layer of a PEFT LoRA layer whose
    adapters are off and unmerged (the engine serves so); None when the forward computes something else."""
    import torch

    if type(module) is torch.nn.Linear:
        return module
    base = getattr(module, "base_layer", None)
    peft_layer = type(module).__module__.startswith("peft.")
    if peft_layer and type(base) is torch.nn.Linear and module.disable_adapters and not module.merged:
        return base
    return None


def _layer_linears(layer: Any) -> dict[str, Any]:
    """A decoder layer's projection modules by name (PEFT's wrappers where PEFT wrapped them)."""
    attn, mlp = layer.self_attn, layer.mlp
    return {
        **{name: getattr(attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj")},
        **{name: getattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")},
    }


class _Layer:
    """One decoder layer's tensors and constants, looked up once per decode call (``linears``: the base ones)."""

    def __init__(self, layer: Any, linears: dict[str, Any]) -> None:
        attn = layer.self_attn
        self.index = attn.layer_idx
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.input_norm = (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        self.post_norm = (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
        self.q, self.k, self.v, self.o = (linears[n] for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        self.gate, self.up, self.down = (linears[n] for n in ("gate_proj", "up_proj", "down_proj"))
        self.act = layer.mlp.act_fn.forward  # hooks checked absent: its forward is its call


def _rms_norm(x: Any, weight: Any, eps: float) -> Any:
    """``LlamaRMSNorm.forward``: float32 statistics, cast back before the weight."""
    import torch

    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)


class FusedStep:
    """One token per row through the decoder layers; ``step(ids, mask, positions, kv)`` -> float32 last logits.

    ``ids`` and ``positions`` (rows, 1), ``mask`` the decode loop's (rows, 1, 1, columns) boolean mask, ``kv``
    its :class:`~populora_engines.decode.StaticKV` (written here; the caller advances its length).
    """

    def __init__(self, model: Any, layer_linears: list[dict[str, Any]], lm_head: Any, adapters: Any) -> None:
        import torch

        inner = model.model
        rotary = inner.rotary_emb
        self.embed = inner.embed_tokens.weight
        self.padding_idx = inner.embed_tokens.padding_idx
        # the rotary forward's own conversion, once: its inv_freq is a float32 copy whatever the model dtype
        self.inv_freq = rotary.inv_freq.to(device=self.embed.device, dtype=torch.float)
        self.attention_scaling = rotary.attention_scaling
        self.layers = [_Layer(layer, linears) for layer, linears in zip(inner.layers, layer_linears)]
        self.norm = (inner.norm.weight, inner.norm.variance_epsilon)
        self.lm_head = lm_head
        self.adapters = adapters

    def _linear(self, linear: Any, x: Any) -> Any:
        import torch

        out = torch.nn.functional.linear(x, linear.weight, linear.bias)
        return out if self.adapters is None else self.adapters.add_delta(linear, x, out)

    def __call__(self, ids: Any, mask: Any, positions: Any, kv: Any) -> Any:
        import torch

        with torch.no_grad():
            hidden = torch.nn.functional.embedding(ids, self.embed, self.padding_idx)
            freqs = positions[..., None].float() * self.inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = (emb.cos() * self.attention_scaling).to(hidden.dtype).unsqueeze(1)
            sin = (emb.sin() * self.attention_scaling).to(hidden.dtype).unsqueeze(1)
            # rotate_half(x) * sin == roll(x, half) * [-sin_1, sin_2]: (-a) * b and a * (-b) round alike, so
            # one roll per tensor replaces rotate_half's slices, negation and concatenation
            half = sin.shape[-1] // 2
            sin_signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
            masked_out = ~mask
            rows = hidden.shape[0]
            for layer in self.layers:
                residual = hidden
                h = _rms_norm(hidden, *layer.input_norm)
                heads_shape = (rows, 1, -1, layer.head_dim)
                q = self._linear(layer.q, h).view(heads_shape).transpose(1, 2)
                k = self._linear(layer.k, h).view(heads_shape).transpose(1, 2)
                v = self._linear(layer.v, h).view(heads_shape).transpose(1, 2)
                q = (q * cos) + (q.roll(half, -1) * sin_signed)
                k = (k * cos) + (k.roll(half, -1) * sin_signed)
                k, v = kv.update(k, v, layer.index)
                attn = attend(q, k, v, masked_out, layer.scaling).reshape(rows, 1, -1).contiguous()
                hidden = residual + self._linear(layer.o, attn)
                residual = hidden
                h = _rms_norm(hidden, *layer.post_norm)
                gated = layer.act(self._linear(layer.gate, h)) * self._linear(layer.up, h)
                hidden = residual + self._linear(layer.down, gated)
            hidden = _rms_norm(hidden, *self.norm)
            return self._linear(self.lm_head, hidden[:, -1:, :])[:, -1, :].float()


def fused_step(model: Any) -> FusedStep | None:
    """The fused step for this call, or None where the forward must run: an unsupported model, a linear that
    is not a plain (or PEFT-disabled) ``nn.Linear``, hooks other than the serving hooks or a patched forward
    on the modules the forward calls. The LoRA deltas are those the serving hooks would add in this thread."""
    from torch.nn.modules import module as torch_module

    if not fused_supported(model):
        return None
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return None
    inner = model.model
    layers = inner.layers[: model.config.num_hidden_layers]
    wrapped = [_layer_linears(layer) for layer in layers]
    layer_linears = [{name: _base_linear(module) for name, module in w.items()} for w in wrapped]
    lm_head = _base_linear(model.lm_head)
    bases = [lm_head, *(linear for linears in layer_linears for linear in linears.values())]
    if any(linear is None for linear in bases):
        return None
    # every module the forward calls: no hooks besides the serving hooks on the base linears, and no
    # forward set on the instance (as a trainer's layer forward is, inside ModelHost.training)
    called = [model, inner, inner.embed_tokens, inner.rotary_emb, inner.norm, model.lm_head]
    for layer, w in zip(layers, wrapped):
        called += [layer, layer.self_attn, layer.mlp, layer.mlp.act_fn, layer.input_layernorm]
        called += [layer.post_attention_layernorm, *w.values()]
    base_ids = {id(linear) for linear in bases}
    for module in called + bases:
        if module._forward_pre_hooks or (id(module) not in base_ids and module._forward_hooks):
            return None
        if "forward" in vars(module):
            return None
    consistent, adapters = hooked_rows(bases)
    return FusedStep(model, layer_linears, lm_head, adapters) if consistent else None
