"""A base model's shape (:class:`populora_core.api.memory.Arch`) from its config.json alone (meta device, no weights):
what ``populora plan`` sizes. Also the memory-size parsing of its flags and where a hub model's config comes from
offline. torch and transformers are imported inside functions only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..api.errors import UserError
from ..api.memory import Arch

_UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_CONFIG_NAMES = {  # Arch field -> transformers config attribute
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "intermediate": "intermediate_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "vocab": "vocab_size",
    "max_positions": "max_position_embeddings",
}


def parse_memory(text: str, flag: str = "--gpu-memory") -> int:
    """``80GiB`` (2^30), ``80GB`` (10^9), ``512MiB``, ``1.5TB`` -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B)\s*", text or "", flags=re.IGNORECASE)
    if not match or float(match.group(1)) <= 0:
        raise UserError(f"{flag}: {text!r} is not a memory size (e.g. 80GiB, 141GiB, 80GB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


#: The model configs shipped with the package's recipes (``populora_core/recipes/configs``; a data folder, no import).
SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "recipes" / "configs"


def config_source(name: str, registry: Any, recipe: str | None, params: dict[str, Any] | None = None) -> Path:
    """config.json of a base model: a registered name or local dir, the HF cache, ``<recipe dir>/configs/``, the
    configs shipped beside the package's recipes (a copied or shipped recipe plans offline too)."""
    if name in registry.names("base_model") or Path(name).expanduser().exists():
        path = Path(registry.base_model(name, params).path)
        if (path / "config.json").is_file():
            return path / "config.json"
        raise UserError(f"base model {name!r}: no config.json in {path}")
    from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")  # only the config: planning never downloads weights
    if isinstance(cached, str):
        return Path(cached)
    file_name = f"{name.replace('/', '__')}.json"
    committed = Path(recipe or ".").parent / "configs" / file_name
    if committed.is_file():
        return committed
    if (SHIPPED_CONFIGS / file_name).is_file():
        return SHIPPED_CONFIGS / file_name
    if not constants.HF_HUB_OFFLINE:
        try:
            return Path(hf_hub_download(name, "config.json"))
        except Exception as exc:  # network, auth, no such repo: the same to the user
            raise UserError(f"base model {name!r}: cannot fetch its config.json ({type(exc).__name__})") from None
    raise UserError(
        f"base model {name!r}: no config.json in the Hugging Face cache (HF_HUB_OFFLINE=1) nor at {committed}; "
        "pass --config PATH"
    )


def load_arch(config_file: str | Path, target_modules: list[str] | tuple[str, ...], dtype: str = "auto") -> Arch:
    """Build the config's model on the meta device (no memory, no weights) and read the targeted linears."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    file = Path(config_file)
    try:
        raw = json.loads(file.read_text())
        conf = AutoConfig.for_model(raw.pop("model_type"), **raw)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(conf)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"model config {file}: cannot build the model ({type(exc).__name__}: {exc})") from None
    targets: dict[str, tuple[int, int, int]] = {}
    for name, module in model.named_modules():
        kind = name.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Linear) and kind in target_modules:
            targets[kind] = (targets.get(kind, (0,))[0] + 1, module.in_features, module.out_features)
    if not targets:
        raise UserError(f"lora.target_modules {list(target_modules)} match no linear module of {file}")
    text = conf.get_text_config()
    sizes = {k: int(getattr(text, name, None) or 0) for k, name in _CONFIG_NAMES.items()}
    sizes["kv_heads"] = sizes["kv_heads"] or sizes["heads"]
    sizes["head_dim"] = sizes["head_dim"] or sizes["hidden"] // sizes["heads"]
    sizes["intermediate"] = sizes["intermediate"] or 4 * sizes["hidden"]
    params = sum(p.numel() for p in model.parameters())
    return Arch(str(file), params=params, targets=targets, dtype=dtype, **sizes)
