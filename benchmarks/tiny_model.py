"""Build a tiny Llama-architecture causal LM with its own byte-level BPE tokenizer, offline.

Shared by benchmarks and tests that need a real model without a hub (here, since benchmarks import nothing of
``tests/``). Deterministic from ``seed``.
Llama (not Qwen2) because transformers 5 reloads any qwen2 tokenizer as Qwen2Tokenizer with its own
pre-tokenizer rules, which would change ids after a save/load round trip.
"""

from __future__ import annotations

import json
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


def make_adapter(path: Path, base_dir: Path | None, seed: int) -> Path:
    """A PEFT adapter with random non-zero B at ``path``: on ``base_dir``'s q_proj and v_proj (r 4), or, with no
    base, a bare one-layer q_proj adapter file pair (for readers that never load a model)."""
    import torch

    if base_dir is None:
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        g = torch.Generator().manual_seed(seed)
        save_file(
            {
                "base_model.model.layers.0.q_proj.lora_A.weight": torch.randn(4, 8, generator=g),
                "base_model.model.layers.0.q_proj.lora_B.weight": torch.randn(8, 4, generator=g),
            },
            str(path / "adapter_model.safetensors"),
        )
        (path / "adapter_config.json").write_text(
            json.dumps(
                {
                    "peft_type": "LORA",
                    "r": 4,
                    "lora_alpha": 8,
                    "target_modules": ["q_proj"],
                    "base_model_name_or_path": "unused",
                }
            )
        )
        return path
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir))
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.5)
    peft_model.save_pretrained(str(path))
    return path
