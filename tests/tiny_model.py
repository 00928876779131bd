"""Build a tiny Llama-architecture causal LM with its own byte-level BPE tokenizer, offline.

Shared by tests and benchmarks that need a real model without a hub. Deterministic from ``seed``.
Llama (not Qwen2) because transformers 5 reloads any qwen2 tokenizer as Qwen2Tokenizer with its own
pre-tokenizer rules, which would change ids after a save/load round trip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

_CORPUS = [
    "def f(x):\n    return x + 1\n",
    "def f(a, b):\n    return [a[i] * b for i in range(len(a))]\n",
    "def f(s):\n    return s[::-1].upper()\n",
    "def f(d):\n    return sorted(d.items(), key=lambda kv: kv[1])\n",
    "```python\n```input\n```output\n<think> </think> <answer> </answer>\n",
    "The quick brown fox jumps over the lazy dog. 0123456789 ()[]{}'\",.:;=+-*/<>\n",
]


def build_tiny_model(
    out_dir: str | Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 512,
    seed: int = 0,
    max_positions: int = 512,
) -> Path:
    """Write a tokenizer + random-init LlamaForCausalLM (float32) to ``out_dir``; returns the path."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", padding_side="left"
    )
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        head_dim=hidden // heads,
    )
    model = cast(Any, LlamaForCausalLM(config)).to(torch.float32)  # transformers' stubs type .to() wrongly
    model.save_pretrained(out)
    return out


def fresh_adapter(base: Any, name: str, lora: Any, *, seed: int, out_dir: str | Path) -> Any:
    """A version-0 adapter written exactly as the loop writes one (``init_lora`` + ``save_lora``)."""
    from populora_core.api.components import AdapterRef
    from populora_core.services.adapters import fresh_lora, save_lora

    save_lora(fresh_lora(base.path, lora, seed=seed), out_dir)
    return AdapterRef(name, str(out_dir))
